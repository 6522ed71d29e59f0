// Package node runs the proxy product on one node: it starts the policy's
// RateLimitly client (and embedded server), proxy listeners and eBPF
// steering, swaps them on reload, reports readiness, and drains on
// shutdown or takeover.
package node

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/rl-tproxy/rl-tproxy/pkg/admission"
	"github.com/rl-tproxy/rl-tproxy/pkg/embedded"
	"github.com/rl-tproxy/rl-tproxy/pkg/evloop"
	"github.com/rl-tproxy/rl-tproxy/pkg/exchange"
	"github.com/rl-tproxy/rl-tproxy/pkg/h2proxy"
	"github.com/rl-tproxy/rl-tproxy/pkg/hook"
	"github.com/rl-tproxy/rl-tproxy/pkg/metrics"
	"github.com/rl-tproxy/rl-tproxy/pkg/passthrough"
	"github.com/rl-tproxy/rl-tproxy/pkg/proxy"
	"github.com/rl-tproxy/rl-tproxy/pkg/ratelimitly/credentials"
	"github.com/rl-tproxy/rl-tproxy/pkg/redirect"
	"github.com/rl-tproxy/rl-tproxy/pkg/rlserver"
	"github.com/rl-tproxy/rl-tproxy/pkg/topkeys"
)

var _ proxy.LoopAttacher = (*embedded.LoopAttacher)(nil)

// DefaultAdmin is the admin listener's default address.
const DefaultAdmin = "127.0.0.1:9901"

// Options configure a node.
type Options struct {
	Policy string // the policy file (reloaded from this path)
	Admin  string // "" or "off" = no admin listener
	Log    *slog.Logger
	Watch  bool // reload when the policy or credentials file changes
	// UpgradeRedirect replaces a pinned sk_lookup program of another build
	// in place (redirect.Config.Upgrade) instead of refusing to start.
	UpgradeRedirect bool
	// Version and Commit label the build-info metric.
	Version, Commit string
	// EventLoops is proxy.Config.EventLoops: the number of event loops
	// that serve HTTP/1.x (0: one per CPU).
	EventLoops int
	// LoopKernelWait says when idle event loops may wait inside
	// io_uring_enter or epoll_pwait2 holding their P (up to 1 ms after each park) also
	// when every P runs a loop, while the RateLimitly client runs on the
	// loops and no connection is served by a goroutine
	// (proxy.Config.HoldP). The zero value is KernelWaitLight.
	LoopKernelWait KernelWait
	// LoopBackend is proxy.Config.LoopBackend (`run --loop-backend`).
	LoopBackend evloop.Backend
	// SpliceMin is proxy.Config.SpliceMin: request and response bodies with
	// at least this many bytes left go by splice(2) (0: the default,
	// negative: never).
	SpliceMin int64
	// UpstreamDNSRefresh is proxy.Config.ResolveTTL: how long the
	// addresses of an upstream named by host name are used before it is
	// looked up again (0: exchange.DefaultResolveTTL).
	UpstreamDNSRefresh time.Duration
	// LogDropped, if set, counts the log lines dropped because the log's
	// reader fell behind (exported as rl_tproxy_log_lines_dropped_total).
	LogDropped func() uint64
	// TopKeys, if set, counts allows and denies by key per zone and serves
	// GET /top on the admin listener.
	TopKeys *topkeys.Registry
	// ServerHooks are test hooks for an embedded server (demo only).
	ServerHooks *rlserver.TestHooks
	// load replaces admission.Load for reloads (tests).
	load func(path string) (*admission.Policy, error)
}

// Node is the running product: policy, gate, RateLimitly client
// (and embedded server), proxy listeners, redirect, admin listener.
type Node struct {
	opts  Options
	log   *slog.Logger
	m     *metrics.Metrics
	ready *metrics.Readiness
	gate  *hook.Gate
	proxy *proxy.Proxy
	h2    *h2proxy.Server // HTTP/2 connections handed off by the proxy
	// checksOffLoop is set while the RateLimitly client in use is not
	// attached to the event loops (its checks are answered by goroutine
	// shards): the loops must then park on every wait (proxy.Config.HoldP).
	checksOffLoop atomic.Bool
	admin         *metrics.Admin
	reloader      *admission.Reloader
	redirect      *redirect.Redirect
	failed        chan error
	// takenOver is closed when another proxy took the steered listeners'
	// sockmap slots (a newer instance started): drain and exit.
	takenOver chan struct{}
	ctx       context.Context // ends when the node shuts down
	cancel    context.CancelFunc
	watchWG   sync.WaitGroup
	// kick asks the reload worker for a reload (SIGHUP); one pending
	// request is enough.
	kick chan struct{}
	// Lock-free views for readiness and the takeover watch, which never
	// wait for n.mu (a reload can hold it while a new client discovers).
	nListeners atomic.Int64
	steeredNow atomic.Pointer[[][]net.Listener]

	mu        sync.Mutex // guards below
	pol       *admission.Policy
	client    *hook.Client
	clientKey string
	emb       *embedded.Embedded
	embKey    string
	cred      credentials.Credential // the client's credential (kept across reloads when generated)
	listeners map[string]*listener   // listener mode, by address
	// steered holds the steered listener groups (SO_REUSEPORT, one socket
	// per event loop or CPU); the first socket of each is the one in the
	// sockmap slot.
	steered [][]net.Listener
	closing bool
	// clientErr is why no RateLimitly client could be created yet (nil
	// once one runs); clientRetry retries with bounded backoff meanwhile.
	clientErr error
}

type listener struct {
	lns    []net.Listener // one SO_REUSEPORT group (proxy.ListenGroup)
	svc    string
	closed bool
	served chan struct{} // closed when its Serve loop returned
}

// Start builds and starts everything pol needs and returns the running
// node; on error everything started so far is shut down again. A
// RateLimitly client that cannot be created (socket, bind, resolver) does
// not fail Start: protected requests follow the failure policy, /readyz
// says why, and creation is retried with bounded backoff.
func Start(parent context.Context, pol *admission.Policy, opts Options) (_ *Node, err error) {
	ctx, cancel := context.WithCancel(parent)
	n := &Node{opts: opts, log: opts.Log, m: metrics.New(opts.Version, opts.Commit), ready: &metrics.Readiness{},
		failed: make(chan error, 4), takenOver: make(chan struct{}), ctx: ctx, cancel: cancel,
		listeners: map[string]*listener{}, kick: make(chan struct{}, 1)}
	defer func() {
		if err != nil {
			sctx, scancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer scancel()
			_ = n.Shutdown(sctx)
		}
	}()
	if opts.LogDropped != nil {
		n.m.Registry.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{
			Namespace: metrics.Namespace, Name: "log_lines_dropped_total",
			Help: "Log lines (access lines included) dropped because the log's reader fell behind (run --log-buffer).",
		}, func() float64 { return float64(opts.LogDropped()) }))
	}
	n.gate = hook.New(hook.Config{Metrics: n.m, AccessLog: opts.Log, Logger: opts.Log, TopKeys: opts.TopKeys})
	n.ready.Set("policy", func() error {
		if p, _ := n.gate.Policy(); p == nil {
			return errors.New("no policy loaded")
		}
		return nil
	})
	n.mu.Lock()
	n.pol = pol
	if err := n.setClient(pol); err != nil {
		n.clientFailed(pol, err)
	}
	n.mu.Unlock()
	n.gate.Swap(pol)
	if err := n.startProxy(ctx, pol); err != nil {
		return nil, err
	}
	n.ready.Set("listeners", n.listenersUp)
	if opts.Admin != "" && opts.Admin != "off" {
		h, paths := n.m.Handler(n.ready), "/metrics /healthz /readyz"
		if opts.TopKeys != nil {
			mux := http.NewServeMux()
			mux.Handle("/top", opts.TopKeys)
			mux.Handle("/", h)
			h, paths = mux, paths+" /top"
		}
		n.admin, err = metrics.StartAdmin(opts.Admin, h)
		if err != nil {
			return nil, err
		}
		n.log.Info("admin listener", "addr", n.admin.Addr().String(), "paths", paths,
			"max_conns", metrics.AdminMaxConns)
	}
	n.reloader = &admission.Reloader{Path: opts.Policy, Load: opts.load, Apply: n.apply, Logger: opts.Log, Observe: n.m.Reload}
	n.reloader.Mark(pol)
	n.goWatch(func() { n.reloadWorker(ctx) })
	if opts.Watch {
		n.startWatch(ctx, pol.RateLimitly.CredentialsFile)
		// Start took a while (listeners, discovery, steering): an edit
		// made since pol was loaded raised no event the watcher saw.
		if n.reloader.Stale() {
			n.log.Info("policy files changed while starting; reloading")
			n.RequestReload()
		}
	}
	return n, nil
}

// startProxy builds the proxy, attaches steering when pol has steered
// services, and opens and serves the listeners.
func (n *Node) startProxy(ctx context.Context, pol *admission.Policy) error {
	// The first bytes of a connection pick its protocol: HTTP/2 goes to
	// the HTTP/2 data path, TLS and other protocols to the passthrough
	// relay (per service: relayed or closed).
	relay := &passthrough.Relay{Observe: n.gate.ObserveConn}
	n.h2 = h2proxy.New()
	n.h2.Logger = n.log                   // the codec's error log, rate-limited
	n.h2.CountError = func(kind string) { // codec protocol errors: rejections_total{status="0",reason="h2-..."}
		n.gate.Reject(nil, netip.AddrPort{}, "h2-"+kind, 0)
	}
	pcfg := proxy.Config{
		Config: exchange.Config{
			Services:   hook.ProxyServices(pol),
			Hook:       n.gate,
			Logger:     n.log,
			ResolveTTL: n.opts.UpstreamDNSRefresh,
		},
		Handoff:     &exchange.HandoffMux{HTTP2: n.h2, TLS: relay, Other: relay},
		EventLoops:  n.opts.EventLoops,
		SpliceMin:   n.opts.SpliceMin,
		LoopBackend: n.opts.LoopBackend,
	}
	if n.opts.LoopKernelWait != KernelWaitOff {
		pcfg.HoldP = func() bool { return !n.checksOffLoop.Load() }
	}
	if n.opts.LoopKernelWait == KernelWaitLight {
		pcfg.HoldPInFlight = LightInFlight
	}
	if steeredPorts(pol) != nil {
		if err := n.attachRedirect(pol); err != nil {
			return err
		}
		pcfg.Dial = n.redirect.Dialer()
		pcfg.DialPrep = n.redirect.DialPrep // IP upstreams: connected on the loops
	}
	p, err := proxy.New(pcfg)
	if err != nil {
		return fmt.Errorf("proxy: %w", err)
	}
	n.mu.Lock()
	n.proxy = p
	// The server first: the loops detach the last attached first, so the
	// client's shards leave before the server's sockets go to workers.
	if n.emb != nil { // started before the proxy: its datagrams wait for the loops
		err = p.Attach(n.emb.LoopAttacher())
	}
	if err == nil && n.client != nil {
		n.attachClient(n.client.C) // the loops run it when they start
	}
	n.mu.Unlock()
	if err != nil {
		return fmt.Errorf("embedded RateLimitly on the event loops: %w", err)
	}
	n.m.SetProxyStats(func() metrics.ProxyStats {
		st := n.proxy.Stats()
		return metrics.ProxyStats{OpenConnections: int64(st.Conns), UpstreamIdle: int64(st.UpstreamIdle),
			EventLoops: st.Loops.Loops, LoopTurns: st.Loops.Turns, LoopParks: st.Loops.Parks,
			LoopKernelWaits: st.Loops.KernelWaits, LoopBuffers: int64(st.Loops.Buffers), LoopStarved: st.Loops.Starved,
			LoopSpliced: st.Loops.Spliced, UpstreamLookups: st.UpstreamLookups, UpstreamLookupErrors: st.UpstreamLookupErrors}
	})
	if err := n.syncListeners(ctx, pol); err != nil {
		return err
	}
	if n.redirect == nil {
		return nil
	}
	// Registering the listener is the takeover (from a previous proxy, or
	// from the services themselves): do it once this proxy can decide, so
	// a takeover opens no window of failed decisions. If discovery takes
	// longer than the bound (or no client could be created), take over
	// anyway: requests follow the failure policy until it decides.
	n.mu.Lock()
	c := n.client
	n.mu.Unlock()
	if c == nil {
		n.log.Warn("taking over steering without a RateLimitly client; requests follow the failure policy until one is created")
	} else if err := waitReady(ctx, c.C, discoveryWait(pol.RateLimitly.ResolverTimeout)); err != nil {
		n.log.Warn("taking over steering before RateLimitly discovery completed; requests follow the failure policy until it does", "error", err.Error())
	}
	if err := n.serveSteered(ctx); err != nil {
		return err
	}
	n.goWatch(func() { n.watchTakeover(ctx) })
	return nil
}

// goWatch runs f on a goroutine Shutdown waits for (bounded by its
// context).
func (n *Node) goWatch(f func()) {
	n.watchWG.Add(1)
	go func() {
		defer n.watchWG.Done()
		f()
	}()
}

// startWatch starts the file watcher and returns once its watches are in
// place (or it failed: SIGHUP still reloads).
func (n *Node) startWatch(ctx context.Context, credentialsFile string) {
	ready := make(chan struct{})
	n.goWatch(func() {
		if err := n.reloader.Watch(ctx, credentialsFile, ready); err != nil {
			n.log.Warn("policy file watch stopped; SIGHUP still reloads", "error", err.Error())
			select {
			case <-ready:
			default:
				close(ready)
			}
		}
	})
	<-ready
}

// RequestReload asks for a reload (as SIGHUP does) and returns at once:
// the reload runs on the node's reload worker, never on the caller's
// (signal) loop. Requests made while one is pending coalesce.
func (n *Node) RequestReload() {
	select {
	case n.kick <- struct{}{}:
	default:
	}
}

// reloadWorker runs the requested reloads until ctx ends.
func (n *Node) reloadWorker(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-n.kick:
			_ = n.reloader.Reload(admission.TriggerSignal) // logged and counted
		}
	}
}

// watcherWait bounds how long Shutdown waits for the watcher, the reload
// worker and the client retry after cancelling them.
const watcherWait = 2 * time.Second

// Shutdown drains: stop watching, take steered listeners out of the
// sockmap (new connections go to the services), drain the proxy, close the
// client after its in-flight checks, then the embedded server, the
// redirect descriptors (pins stay) and the admin listener.
func (n *Node) Shutdown(ctx context.Context) error {
	// Cancel first: a reload waiting for a new client's discovery (with
	// n.mu held) gives up, so the lock below is never held for long.
	if n.cancel != nil {
		n.cancel()
	}
	n.mu.Lock()
	n.closing = true
	steered := slices.Clone(n.steered)
	n.mu.Unlock()
	watchers := make(chan struct{})
	go func() {
		n.watchWG.Wait()
		close(watchers)
	}()
	select {
	case <-watchers:
	case <-ctx.Done():
	case <-time.After(watcherWait):
		// A reload stuck in a read the kernel does not interrupt (every
		// file is opened non-blocking, but a hung filesystem can still
		// block): drain without it; the process exit ends it.
		n.log.Warn("a reload is still running; draining without waiting for it")
	}
	var errs []error
	var all []net.Listener
	for _, g := range steered {
		all = append(all, g...)
		if n.redirect != nil {
			if err := n.redirect.UnregisterListener(g[0]); err != nil {
				errs = append(errs, err)
			}
		}
	}
	if len(steered) > 0 {
		// New connections now go to the services (or a newer proxy), but
		// some already sit in the accept queues of our groups' sockets or
		// are mid-handshake on them: keep accepting until every queue
		// stayed empty for a moment, so closing the sockets resets nobody.
		drainAcceptQueues(ctx, all)
	}
	if n.proxy != nil {
		if err := n.proxy.Shutdown(ctx); err != nil {
			errs = append(errs, fmt.Errorf("drain: %w", err))
		}
	}
	if n.h2 != nil { // its connections ended with the proxy's; close its upstream pools
		if err := n.h2.Shutdown(ctx); err != nil {
			errs = append(errs, err)
		}
	}
	if n.gate != nil {
		select {
		case <-n.gate.Close():
		case <-ctx.Done():
			errs = append(errs, errors.New("RateLimitly client still busy at the drain bound"))
		}
	}
	n.mu.Lock()
	emb := n.emb
	n.mu.Unlock()
	if emb != nil {
		errs = append(errs, emb.Close())
	}
	if n.redirect != nil {
		errs = append(errs, n.redirect.Close())
	}
	if n.admin != nil {
		errs = append(errs, n.admin.Close(ctx))
	}
	return errors.Join(errs...)
}

// Reload reloads the policy file now and waits for the result; the error
// is the load or apply error, already logged and counted.
func (n *Node) Reload(trigger string) error { return n.reloader.Reload(trigger) }

// TakenOver is closed when a newer proxy took over the steered listeners.
func (n *Node) TakenOver() <-chan struct{} { return n.takenOver }

// Failed delivers a runtime failure (a serve loop that ended unexpectedly).
func (n *Node) Failed() <-chan error { return n.failed }

// AdminAddr is the admin listener's address (nil when it is off).
func (n *Node) AdminAddr() net.Addr {
	if n.admin == nil {
		return nil
	}
	return n.admin.Addr()
}

// Policy returns the policy in force and its generation.
func (n *Node) Policy() (*admission.Policy, uint64) { return n.gate.Policy() }

// Embedded returns the embedded RateLimitly in use (nil when none).
func (n *Node) Embedded() *embedded.Embedded {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.emb
}

// Decides reports whether the current RateLimitly client completed its
// first discovery, and the last discovery error.
func (n *Node) Decides() (bool, error) {
	n.mu.Lock()
	c := n.client
	n.mu.Unlock()
	if c == nil {
		return false, errors.New("no RateLimitly client")
	}
	return c.C.Ready(), c.C.DiscoveryError()
}

// Ready runs the readiness checks /readyz runs.
func (n *Node) Ready() (lines []string, ok bool) { return n.ready.Check() }
