package main

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"slices"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/rl-tproxy/rl-tproxy/pkg/admission"
	"github.com/rl-tproxy/rl-tproxy/pkg/embedded"
	"github.com/rl-tproxy/rl-tproxy/pkg/hook"
	"github.com/rl-tproxy/rl-tproxy/pkg/metrics"
	"github.com/rl-tproxy/rl-tproxy/pkg/proxy"
	"github.com/rl-tproxy/rl-tproxy/pkg/ratelimitly"
	"github.com/rl-tproxy/rl-tproxy/pkg/ratelimitly/credentials"
	"github.com/rl-tproxy/rl-tproxy/pkg/redirect"
	"github.com/rl-tproxy/rl-tproxy/pkg/rlclient"
	"github.com/rl-tproxy/rl-tproxy/pkg/rlserver"
)

func init() {
	register("run", "run the proxy", runRun)
}

// DefaultAdmin is the admin listener's default address.
const DefaultAdmin = "127.0.0.1:9901"

// runRun is `rl-tproxy run`: load the policy, start everything, serve until
// SIGTERM/SIGINT, reload on SIGHUP and on file change.
func runRun(args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("run", "run --policy FILE [--admin ADDR] [--log-format text|json] [--log-level debug|info|warn|error]",
		"Runs the proxy with the given policy file. SIGHUP (or a change of the policy or credentials file) reloads it;\n"+
			"SIGTERM/SIGINT drain in-flight requests (bounded by --drain-timeout) and exit.\n"+
			"Exit codes: 0 after a clean stop, 1 invalid policy or flags, 2 runtime failure.", stderr)
	policy := fs.String("policy", "", "policy file (YAML)")
	admin := fs.String("admin", DefaultAdmin, "admin listener address for /metrics, /healthz, /readyz (port 0 picks a free port; \"off\" disables)")
	logFormat := fs.String("log-format", "text", "log format: text or json")
	logLevel := fs.String("log-level", "info", "log level: debug, info, warn or error")
	drain := fs.Duration("drain-timeout", 20*time.Second, "longest graceful drain on SIGTERM/SIGINT")
	watch := fs.Bool("watch", true, "reload when the policy or credentials file changes (inotify on their directories)")
	if done, code := parseFlags(fs, args, stdout); done {
		return code
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "rl-tproxy run: unexpected argument %q\n", fs.Arg(0))
		return exitInvalid
	}
	if *policy == "" {
		fmt.Fprintln(stderr, "rl-tproxy run: --policy FILE is required")
		return exitInvalid
	}
	log, err := newLogger(*logFormat, *logLevel, stderr)
	if err != nil {
		fmt.Fprintf(stderr, "rl-tproxy run: %v\n", err)
		return exitInvalid
	}
	pol, err := admission.Load(*policy)
	if err != nil {
		printLoadError(stderr, "run", *policy, err)
		return exitInvalid
	}
	sig := notifySignals()
	defer sig.stop()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	rt, err := startRuntime(ctx, pol, runOptions{Policy: *policy, Admin: *admin, Log: log, Watch: *watch})
	if err != nil {
		log.Error("start failed", "error", err.Error())
		return exitRuntime
	}
	log.Info("rl-tproxy running", "version", version, "policy", *policy, "summary", pol.Summary())
	code := exitOK
loop:
	for {
		select {
		case <-sig.hup:
			_ = rt.reloader.Reload(admission.TriggerSignal)
		case s := <-sig.term:
			log.Info("shutting down", "signal", s.String(), "drain_timeout", drain.String())
			break loop
		case <-rt.takenOver:
			log.Info("shutting down", "reason", "taken over", "drain_timeout", drain.String())
			break loop
		case err := <-rt.failed:
			log.Error("runtime failure", "error", err.Error())
			code = exitRuntime
			break loop
		}
	}
	dctx, dcancel := context.WithTimeout(context.Background(), *drain)
	defer dcancel()
	if err := rt.shutdown(dctx); err != nil {
		log.Warn("shutdown incomplete", "error", err.Error())
	}
	log.Info("stopped")
	return code
}

func printLoadError(w io.Writer, cmd, path string, err error) {
	var le *admission.LoadError
	if errors.As(err, &le) {
		for _, e := range le.Errs {
			fmt.Fprintln(w, e.Error())
		}
		fmt.Fprintf(w, "rl-tproxy %s: %s: %d error(s)\n", cmd, path, len(le.Errs))
		return
	}
	fmt.Fprintf(w, "rl-tproxy %s: %v\n", cmd, err)
}

// newLogger builds the process logger (text or JSON on w).
func newLogger(format, level string, w io.Writer) (*slog.Logger, error) {
	var lv slog.Level
	switch strings.ToLower(level) {
	case "debug":
		lv = slog.LevelDebug
	case "info":
		lv = slog.LevelInfo
	case "warn", "warning":
		lv = slog.LevelWarn
	case "error":
		lv = slog.LevelError
	default:
		return nil, fmt.Errorf("--log-level %q: want debug, info, warn or error", level)
	}
	opts := &slog.HandlerOptions{Level: lv}
	switch format {
	case "text":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	}
	return nil, fmt.Errorf("--log-format %q: want text or json", format)
}

// runOptions configure a runtime.
type runOptions struct {
	Policy string
	Admin  string // "" or "off" = no admin listener
	Log    *slog.Logger
	Watch  bool
	// ServerHooks are test hooks for an embedded server (demo only).
	ServerHooks *rlserver.TestHooks
}

// runtime is the running product: policy, gate, RateLimitly client
// (and embedded server), proxy listeners, redirect, admin listener.
type product struct {
	opts     runOptions
	log      *slog.Logger
	m        *metrics.Metrics
	ready    *metrics.Readiness
	gate     *hook.Gate
	proxy    *proxy.Proxy
	admin    *metrics.Admin
	reloader *admission.Reloader
	redirect *redirect.Redirect
	failed   chan error
	// takenOver is closed when another proxy took the steered listeners'
	// sockmap slots (a newer instance started): drain and exit.
	takenOver chan struct{}
	cancel    context.CancelFunc
	watchWG   sync.WaitGroup

	mu        sync.Mutex // guards below
	pol       *admission.Policy
	client    *hook.Client
	clientKey string
	emb       *embedded.Embedded
	embKey    string
	cred      credentials.Credential // the client's credential (kept across reloads when generated)
	listeners map[string]*listener   // listener mode, by address
	steered   []net.Listener
	closing   bool
}

type listener struct {
	ln     net.Listener
	svc    string
	closed bool
}

func startRuntime(parent context.Context, pol *admission.Policy, opts runOptions) (_ *product, err error) {
	ctx, cancel := context.WithCancel(parent)
	rt := &product{opts: opts, log: opts.Log, m: metrics.New(version, commit), ready: &metrics.Readiness{},
		failed: make(chan error, 4), takenOver: make(chan struct{}), cancel: cancel, listeners: map[string]*listener{}}
	defer func() {
		if err != nil {
			sctx, scancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer scancel()
			_ = rt.shutdown(sctx)
		}
	}()
	rt.gate = hook.New(hook.Config{Metrics: rt.m, AccessLog: opts.Log, Logger: opts.Log})
	rt.ready.Set("policy", func() error {
		if p, _ := rt.gate.Policy(); p == nil {
			return errors.New("no policy loaded")
		}
		return nil
	})
	if err := rt.setClient(pol); err != nil {
		return nil, err
	}
	rt.gate.Swap(pol)
	rt.pol = pol
	pcfg := proxy.Config{Services: hook.ProxyServices(pol), Hook: rt.gate, Logger: opts.Log}
	if steeredPorts(pol) != nil {
		if err := rt.attachRedirect(pol); err != nil {
			return nil, err
		}
		pcfg.Dial = rt.redirect.Dialer()
	}
	rt.proxy, err = proxy.New(pcfg)
	if err != nil {
		return nil, fmt.Errorf("proxy: %w", err)
	}
	rt.m.SetProxyStats(func() metrics.ProxyStats {
		st := rt.proxy.Stats()
		return metrics.ProxyStats{OpenConnections: int64(st.Conns), UpstreamIdle: int64(st.UpstreamIdle)}
	})
	if err := rt.syncListeners(ctx, pol); err != nil {
		return nil, err
	}
	if rt.redirect != nil {
		// Registering the listener is the takeover (from a previous proxy,
		// or from the services themselves): do it once this proxy can
		// decide, so a takeover opens no window of failed decisions. If
		// discovery takes longer than the bound, take over anyway.
		if err := waitReady(rt.client.C, discoveryWait(pol.RateLimitly.ResolverTimeout)); err != nil {
			rt.log.Warn("taking over steering before RateLimitly discovery completed; requests follow the failure policy until it does", "error", err.Error())
		}
		if err := rt.serveSteered(ctx); err != nil {
			return nil, err
		}
		rt.watchWG.Add(1)
		go func() {
			defer rt.watchWG.Done()
			rt.watchTakeover(ctx)
		}()
	}
	rt.ready.Set("listeners", rt.listenersUp)
	if opts.Admin != "" && opts.Admin != "off" {
		rt.admin, err = metrics.StartAdmin(opts.Admin, rt.m.Handler(rt.ready))
		if err != nil {
			return nil, err
		}
		rt.log.Info("admin listener", "addr", rt.admin.Addr().String(), "paths", "/metrics /healthz /readyz")
	}
	rt.reloader = &admission.Reloader{Path: opts.Policy, Apply: rt.apply, Logger: opts.Log, Observe: rt.m.Reload}
	rt.reloader.Mark(pol)
	if opts.Watch {
		ready := make(chan struct{})
		rt.watchWG.Add(1)
		go func() {
			defer rt.watchWG.Done()
			if err := rt.reloader.Watch(ctx, pol.RateLimitly.CredentialsFile, ready); err != nil {
				rt.log.Warn("policy file watch stopped; SIGHUP still reloads", "error", err.Error())
				select {
				case <-ready:
				default:
					close(ready)
				}
			}
		}()
		<-ready
	}
	return rt, nil
}

// clientConfigKey identifies everything that needs a new RateLimitly
// client (and embedded server) when it changes.
func clientConfigKey(rl *admission.RateLimitly) (client, emb string) {
	h := sha256.New()
	cred := rl.Credential
	if rl.Embedded && rl.GeneratedCredential {
		fmt.Fprint(h, "generated")
	} else {
		fmt.Fprintf(h, "%s/%d/%x/%v", cred.Tenant, cred.KeyID, cred.Secret, cred.MaxHorizon)
	}
	for _, c := range rl.Credentials {
		if !rl.GeneratedCredential {
			fmt.Fprintf(h, "|%s/%d/%x/%v", c.Tenant, c.KeyID, c.Secret, c.MaxHorizon)
		}
	}
	creds := fmt.Sprintf("%x", h.Sum(nil))
	p := rl.RequestPolicy
	client = fmt.Sprintf("srv=%s emb=%v res=%s rt=%v bind=%v pol=%s/%v/%v/%d/%v/%v creds=%s",
		rl.SRV, rl.Embedded, rl.Resolver, rl.ResolverTimeout, rl.Bind, p.Name, p.Unit, p.ReplayGaps, p.Replays, p.FinalReceive, p.Completion, creds)
	if rl.Embedded {
		emb = creds
	}
	return client, emb
}

// setClient builds (or keeps) the RateLimitly client and the embedded
// server for pol. A new client is installed in the gate only once it was
// built; the old one is closed after its in-flight checks, and a replaced
// embedded server after that.
func (rt *product) setClient(pol *admission.Policy) error {
	rl := &pol.RateLimitly
	ckey, ekey := clientConfigKey(rl)
	if ckey == rt.clientKey && rt.client != nil {
		return nil
	}
	cred := rl.Credential
	creds := rl.Credentials
	if rl.Embedded && rl.GeneratedCredential && rt.emb != nil && rt.embKey == ekey {
		cred = rt.cred // keep the generated key the running embedded server knows
	}
	if len(creds) == 0 || (rl.GeneratedCredential && rt.emb == nil) {
		creds = []credentials.Credential{cred}
	}
	srvName, resolver := rl.SRV, rl.Resolver
	emb := rt.emb
	newEmb := false
	if rl.Embedded && (emb == nil || rt.embKey != ekey) {
		var err error
		emb, err = embedded.Start(embedded.Config{Credentials: creds, Logger: rt.log, Hooks: rt.opts.ServerHooks})
		if err != nil {
			return err
		}
		newEmb = true
		rt.log.Info("embedded RateLimitly started", "server", emb.Server.Addr().String(), "dns", emb.Resolver, "srv", emb.SRV)
	}
	if rl.Embedded {
		srvName, resolver = emb.SRV, emb.Resolver
	}
	p := rl.RequestPolicy
	c, err := rlclient.New(rlclient.Config{
		SRV: srvName, Resolver: resolver, ResolverTimeout: rl.ResolverTimeout, Credential: cred,
		Policy: ratelimitly.RequestPolicy(p),
		Bind:   rl.Bind, Logger: rt.log,
	})
	if err != nil {
		if newEmb {
			_ = emb.Close()
		}
		return fmt.Errorf("ratelimitly client: %w", err)
	}
	if rt.client != nil {
		// Swap only to a client that can decide: wait (bounded) for its
		// first discovery, else keep the old one.
		if err := waitReady(c, discoveryWait(rl.ResolverTimeout)); err != nil {
			_ = c.Close()
			if newEmb {
				_ = emb.Close()
			}
			return fmt.Errorf("new RateLimitly client (srv %s): %w; keeping the current one", srvName, err)
		}
	}
	gc := hook.NewClient(c)
	oldEmb := rt.emb
	replacedEmb := newEmb && oldEmb != nil
	closed := rt.gate.SetChecker(gc, gc)
	if rt.client != nil {
		rt.m.ClientRebuilt()
		rt.log.Info("RateLimitly client rebuilt", "srv", srvName)
	}
	if replacedEmb || (!rl.Embedded && oldEmb != nil) {
		go func() {
			<-closed // the old client is closed: no check can reach the old server
			_ = oldEmb.Close()
		}()
	}
	rt.client, rt.clientKey, rt.cred = gc, ckey, cred
	if rl.Embedded {
		rt.emb, rt.embKey = emb, ekey
		rt.m.SetServerStats(func() metrics.ServerStats {
			s := emb.Server.Stats()
			return metrics.ServerStats{Requests: s.Requests, Allows: s.Allows, Denies: s.Denies, Reports: s.Reports, Completions: s.Completions, Dropped: s.Drops}
		})
	} else {
		rt.emb, rt.embKey = nil, ""
		rt.m.SetServerStats(nil)
	}
	rt.m.SetClientStats(gc.Stats)
	rt.ready.Set("ratelimitly", func() error {
		if c.Ready() {
			return nil
		}
		if err := c.DiscoveryError(); err != nil {
			return fmt.Errorf("discovery not done yet: %w", err)
		}
		return errors.New("discovery not done yet")
	})
	return nil
}

// discoveryWait bounds the wait for a rebuilt client's first discovery.
func discoveryWait(resolverTimeout time.Duration) time.Duration {
	if resolverTimeout <= 0 {
		resolverTimeout = rlclient.DefaultResolverTimeout
	}
	return 2*resolverTimeout + time.Second
}

// waitReady polls c until its first discovery succeeded or d passed.
func waitReady(c *rlclient.Client, d time.Duration) error {
	deadline := time.Now().Add(d)
	for !c.Ready() {
		if time.Now().After(deadline) {
			if err := c.DiscoveryError(); err != nil {
				return fmt.Errorf("discovery not done within %s: %w", d, err)
			}
			return fmt.Errorf("discovery not done within %s", d)
		}
		time.Sleep(5 * time.Millisecond)
	}
	return nil
}

// apply installs a validated policy (Reloader.Apply).
func (rt *product) apply(p *admission.Policy) error {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	if rt.closing {
		return errors.New("shutting down")
	}
	if (steeredPorts(p) != nil) != (rt.redirect != nil) {
		return errors.New("switching between listener mode and steered (port:) services needs a restart")
	}
	// Everything that can fail happens before anything is swapped: the
	// proxy configuration is validated and new listeners are opened first.
	cfg := *rt.proxy.Config()
	cfg.Services = hook.ProxyServices(p)
	if _, err := proxy.New(cfg); err != nil {
		return fmt.Errorf("proxy configuration: %w", err)
	}
	opened, err := rt.openListeners(context.Background(), p)
	if err != nil {
		return err
	}
	if err := rt.setClient(p); err != nil {
		closeAll(opened)
		return err
	}
	rt.gate.Swap(p)
	if err := rt.proxy.Update(cfg); err != nil {
		// Validated above; if it still fails the gate already uses p.
		rt.log.Error("proxy update after validation failed", "error", err.Error())
	}
	if rt.redirect != nil {
		if err := rt.redirect.Reload(redirectConfig(p)); err != nil {
			rt.log.Error("redirect reload failed; steering keeps the previous ports", "error", err.Error())
		}
	}
	rt.pol = p
	rt.commitListeners(p, opened)
	return nil
}

func closeAll(ls map[string]*listener) {
	for _, l := range ls {
		l.ln.Close()
	}
}

// acceptQueueLen is the number of connections waiting in a listening
// socket's accept queue (TCP_INFO's tcpi_unacked on a LISTEN socket).
func acceptQueueLen(ln net.Listener) (int, error) {
	sc, ok := ln.(syscall.Conn)
	if !ok {
		return 0, fmt.Errorf("%T exposes no socket", ln)
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return 0, err
	}
	var n int
	var ierr error
	if err := rc.Control(func(fd uintptr) {
		var info *unix.TCPInfo
		info, ierr = unix.GetsockoptTCPInfo(int(fd), unix.IPPROTO_TCP, unix.TCP_INFO)
		if ierr == nil {
			n = int(info.Unacked)
		}
	}); err != nil {
		return 0, err
	}
	return n, ierr
}

// drainAcceptQueues waits (bounded by ctx and 2s) until every listener's
// accept queue was empty at two checks 50ms apart: handshakes that were in
// flight when the sockmap slot changed complete within that round trip.
func drainAcceptQueues(ctx context.Context, lns []net.Listener) {
	deadline := time.Now().Add(2 * time.Second)
	empty := 0
	for empty < 2 && time.Now().Before(deadline) && ctx.Err() == nil {
		total := 0
		for _, ln := range lns {
			if n, err := acceptQueueLen(ln); err == nil {
				total += n
			}
		}
		if total == 0 {
			empty++
		} else {
			empty = 0
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// takeoverPoll is how often a steered proxy checks that its listeners are
// still in the sockmap.
const takeoverPoll = 500 * time.Millisecond

// watchTakeover closes rt.takenOver once none of this proxy's steered
// listeners is in the sockmap any more: a newer proxy registered its own
// (the takeover of a rolling update or restart), so this one drains and
// exits.
func (rt *product) watchTakeover(ctx context.Context) {
	t := time.NewTicker(takeoverPoll)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		rt.mu.Lock()
		lns := slices.Clone(rt.steered)
		rt.mu.Unlock()
		still := false
		for _, ln := range lns {
			ok, err := rt.redirect.ListenerRegistered(ln)
			if err != nil || ok {
				still = true // on a read error, keep serving
				break
			}
		}
		if !still && len(lns) > 0 {
			rt.log.Info("steering taken over by another proxy: draining and exiting")
			close(rt.takenOver)
			return
		}
	}
}

// steeredPorts lists the policy's steered ports (nil when none).
func steeredPorts(p *admission.Policy) []uint16 {
	var ports []uint16
	for _, s := range p.Services {
		if s.Port != 0 && !slices.Contains(ports, s.Port) {
			ports = append(ports, s.Port)
		}
	}
	sort.Slice(ports, func(i, j int) bool { return ports[i] < ports[j] })
	return ports
}

func redirectConfig(p *admission.Policy) redirect.Config {
	cfg := redirect.Config{Ports: steeredPorts(p)}
	any := false
	for _, s := range p.Services {
		if s.Port == 0 {
			continue
		}
		if len(s.Prefixes) == 0 {
			any = true
		}
		cfg.Prefixes = append(cfg.Prefixes, s.Prefixes...)
		cfg.SteerLoopback = cfg.SteerLoopback || s.SteerLoopback
	}
	if any {
		cfg.Prefixes = nil
	}
	return cfg
}

func (rt *product) attachRedirect(p *admission.Policy) error {
	if err := redirect.EnsureBPFFS("/sys/fs/bpf"); err != nil {
		return fmt.Errorf("steered services need bpffs: %w", err)
	}
	r, err := redirect.Attach(redirectConfig(p))
	if err != nil {
		return fmt.Errorf("attach sk_lookup redirect: %w", err)
	}
	rt.redirect = r
	rt.m.Registry.MustRegister(r.Collector())
	rt.ready.Set("redirect", func() error {
		rt.mu.Lock()
		lns := slices.Clone(rt.steered)
		rt.mu.Unlock()
		for _, ln := range lns {
			ok, err := r.ListenerRegistered(ln)
			if err != nil {
				return err
			}
			if !ok {
				return fmt.Errorf("listener %s is not in the sockmap (taken over?)", ln.Addr())
			}
		}
		if len(lns) == 0 {
			return errors.New("no steered listener")
		}
		return nil
	})
	return nil
}

// serveSteered opens the steered listeners (IPv4 and, when the host has
// it, IPv6 loopback), registers them in the sockmap and serves them.
func (rt *product) serveSteered(ctx context.Context) error {
	for _, addr := range []string{"127.0.0.1:0", "[::1]:0"} {
		ln, err := proxy.Listen(ctx, addr)
		if err != nil {
			if strings.HasPrefix(addr, "[") {
				continue // no IPv6 loopback
			}
			return fmt.Errorf("steered listener: %w", err)
		}
		if err := rt.redirect.RegisterListener(ln); err != nil {
			ln.Close()
			if strings.HasPrefix(addr, "[") {
				rt.log.Warn("IPv6 steered listener not registered", "error", err.Error())
				continue
			}
			return fmt.Errorf("register steered listener: %w", err)
		}
		rt.mu.Lock()
		rt.steered = append(rt.steered, ln)
		rt.mu.Unlock()
		rt.log.Info("steered listener registered", "addr", ln.Addr().String(), "ports", fmt.Sprint(steeredPorts(rt.pol)))
		go func() {
			err := rt.proxy.ServeSteered(ln, nil)
			rt.serveEnded("steered "+ln.Addr().String(), err, nil)
		}()
	}
	return nil
}

func (rt *product) syncListeners(ctx context.Context, p *admission.Policy) error {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	opened, err := rt.openListeners(ctx, p)
	if err != nil {
		return err
	}
	rt.commitListeners(p, opened)
	return nil
}

// wantListeners maps each listener-mode address of p to its service.
func wantListeners(p *admission.Policy) map[string]string {
	want := map[string]string{}
	for _, s := range p.Services {
		for _, a := range s.Listen {
			want[a.String()] = s.Name
		}
	}
	return want
}

// openListeners opens the listener-mode addresses of p that are not open
// yet (or belong to another service now); on error it closes what it
// opened.
func (rt *product) openListeners(ctx context.Context, p *admission.Policy) (map[string]*listener, error) {
	want := wantListeners(p)
	addrs := make([]string, 0, len(want))
	for a := range want {
		addrs = append(addrs, a)
	}
	sort.Strings(addrs)
	opened := map[string]*listener{}
	for _, addr := range addrs {
		if l, ok := rt.listeners[addr]; ok && l.svc == want[addr] {
			continue
		}
		if _, ok := rt.listeners[addr]; ok {
			continue // same address, other service: reused below
		}
		ln, err := proxy.Listen(ctx, addr)
		if err != nil {
			closeAll(opened)
			return nil, fmt.Errorf("service %s: listen %s: %w", want[addr], addr, err)
		}
		opened[addr] = &listener{ln: ln, svc: want[addr]}
	}
	return opened, nil
}

// commitListeners serves the newly opened listeners and closes those p no
// longer has (their in-flight requests finish). A listener whose address
// moved to another service keeps its socket: Serve picks the service by
// name per connection, so it is restarted for the new name.
func (rt *product) commitListeners(p *admission.Policy, opened map[string]*listener) {
	want := wantListeners(p)
	svcs := map[string]*proxy.Service{}
	for _, s := range rt.proxy.Config().Services {
		svcs[s.Name] = s
	}
	for addr, l := range rt.listeners {
		if _, ok := want[addr]; !ok {
			l.closed = true
			l.ln.Close()
			delete(rt.listeners, addr)
			rt.log.Info("listener closed", "addr", addr, "service", l.svc)
		} else if l.svc != want[addr] {
			rt.log.Warn("listen address moved to another service; its connections use the old service until restart", "addr", addr, "old", l.svc, "new", want[addr])
		}
	}
	for addr, l := range opened {
		rt.listeners[addr] = l
		svc := svcs[l.svc]
		rt.log.Info("listening", "service", l.svc, "addr", l.ln.Addr().String(), "upstream", svc.Upstream)
		go func() {
			err := rt.proxy.Serve(l.ln, svc)
			rt.serveEnded("listener "+addr, err, l)
		}()
	}
}

// serveEnded turns an unexpected end of a Serve loop into a runtime
// failure.
func (rt *product) serveEnded(what string, err error, l *listener) {
	rt.mu.Lock()
	expected := rt.closing || (l != nil && l.closed)
	rt.mu.Unlock()
	if expected || errors.Is(err, proxy.ErrClosed) || errors.Is(err, net.ErrClosed) {
		return
	}
	if err == nil {
		err = errors.New("stopped")
	}
	select {
	case rt.failed <- fmt.Errorf("%s: %w", what, err):
	default:
	}
}

func (rt *product) listenersUp() error {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	if len(rt.listeners) == 0 && len(rt.steered) == 0 {
		return errors.New("no listener")
	}
	return nil
}

// shutdown drains: stop watching, take steered listeners out of the
// sockmap (new connections go to the services), drain the proxy, close the
// client after its in-flight checks, then the embedded server, the
// redirect descriptors (pins stay) and the admin listener.
func (rt *product) shutdown(ctx context.Context) error {
	rt.mu.Lock()
	rt.closing = true
	steered := slices.Clone(rt.steered)
	rt.mu.Unlock()
	if rt.cancel != nil {
		rt.cancel()
	}
	rt.watchWG.Wait()
	var errs []error
	for _, ln := range steered {
		if rt.redirect != nil {
			if err := rt.redirect.UnregisterListener(ln); err != nil {
				errs = append(errs, err)
			}
		}
	}
	if len(steered) > 0 {
		// New connections now go to the services (or a newer proxy), but
		// some already sit in our accept queues or are mid-handshake on
		// our listeners: keep accepting until the queues stayed empty for
		// a moment, so closing the listeners resets nobody.
		drainAcceptQueues(ctx, steered)
	}
	if rt.proxy != nil {
		if err := rt.proxy.Shutdown(ctx); err != nil {
			errs = append(errs, fmt.Errorf("drain: %w", err))
		}
	}
	if rt.gate != nil {
		select {
		case <-rt.gate.Close():
		case <-ctx.Done():
			errs = append(errs, errors.New("RateLimitly client still busy at the drain bound"))
		}
	}
	rt.mu.Lock()
	emb := rt.emb
	rt.mu.Unlock()
	if emb != nil {
		errs = append(errs, emb.Close())
	}
	if rt.redirect != nil {
		errs = append(errs, rt.redirect.Close())
	}
	if rt.admin != nil {
		errs = append(errs, rt.admin.Close(ctx))
	}
	return errors.Join(errs...)
}
