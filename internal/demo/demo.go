// Package demo is the self-contained walkthrough behind `rl-tproxy demo`:
// a sample upstream and a node with embedded RateLimitly in listener mode,
// driven by a scripted burst, a latency guard and a live reload.
package demo

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
	"gopkg.in/yaml.v3"

	"github.com/rl-tproxy/rl-tproxy/internal/node"
	"github.com/rl-tproxy/rl-tproxy/internal/safefile"
	"github.com/rl-tproxy/rl-tproxy/pkg/admission"
)

// ErrInvalid marks a policy the demo cannot run (no embedded RateLimitly,
// no listener-mode service, or a copy that does not load).
var ErrInvalid = errors.New("policy unsuitable for the demo")

// Config is what the demo runs with.
type Config struct {
	Policy     *admission.Policy // loaded from PolicyPath
	PolicyPath string
	NoWait     bool // exit after the scripted part
	Out        io.Writer
	Log        *slog.Logger
	// Version and Commit label the node's build-info metric.
	Version, Commit string
	// EventLoops is node.Options.EventLoops (0: one per CPU).
	EventLoops int
}

// Run starts a sample upstream, the embedded RateLimitly and the proxy in
// listener mode with a copy of the policy, drives a scripted burst of real
// requests and prints what happened to cfg.Out; then it keeps serving
// until SIGTERM/SIGINT unless cfg.NoWait or stdin is not a terminal.
func Run(cfg Config) error {
	d, err := newDemo(cfg.Policy, cfg.PolicyPath, cfg.Out, cfg.Log)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	defer d.close()
	d.version, d.commit, d.loops = cfg.Version, cfg.Commit, cfg.EventLoops
	if err := d.start(); err != nil {
		return err
	}
	start := time.Now()
	if err := d.script(); err != nil {
		return err
	}
	fmt.Fprintf(cfg.Out, "\nScripted part done in %.1fs.\n", time.Since(start).Seconds())
	if cfg.NoWait || !isTerminal(os.Stdin) {
		return nil
	}
	d.interactive()
	return nil
}

func isTerminal(f *os.File) bool {
	_, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS)
	return err == nil
}

type demo struct {
	out             io.Writer
	log             *slog.Logger
	srcPath         string
	dir             string
	path            string // the demo's copy of the policy
	node            yaml.Node
	pol             *admission.Policy
	svc             *admission.Service
	proxy           string // proxy base URL
	upAddr          string
	up              *http.Server
	slow            atomic.Int64 // upstream delay in ns
	rt              *node.Node
	client          *http.Client
	version, commit string
	loops           int // Config.EventLoops
}

func newDemo(src *admission.Policy, srcPath string, out io.Writer, log *slog.Logger) (*demo, error) {
	if !src.RateLimitly.Embedded {
		return nil, fmt.Errorf("%s: the demo needs `ratelimitly: {embedded: true}`", srcPath)
	}
	var svc *admission.Service
	for _, s := range src.Services {
		if len(s.Listen) > 0 {
			svc = s
			break
		}
	}
	if svc == nil {
		return nil, fmt.Errorf("%s: the demo needs a listener-mode service (`listen:`); steered `port:` services need root", srcPath)
	}
	d := &demo{out: out, log: log, srcPath: srcPath, svc: svc, upAddr: svc.Upstream,
		client: &http.Client{Timeout: 10 * time.Second}}
	raw, err := safefile.Read(srcPath, 4<<20)
	if err != nil {
		return nil, err
	}
	if err := yaml.Unmarshal(raw, &d.node); err != nil {
		return nil, fmt.Errorf("%s: %w", srcPath, err)
	}
	d.dir, err = os.MkdirTemp("", "rl-tproxy-demo-")
	if err != nil {
		return nil, err
	}
	// The copy lives in a temp dir, and so does a copy of the
	// credentials, readable by their owner only (a git checkout makes the
	// example world-readable, which a real key must not be).
	if f := src.RateLimitly.CredentialsFile; f != "" {
		cred, err := safefile.Read(f, 1<<20)
		if err != nil {
			return nil, err
		}
		copyPath := filepath.Join(d.dir, "credentials.yaml")
		if err := os.WriteFile(copyPath, cred, 0o600); err != nil {
			return nil, fmt.Errorf("copy credentials %s: %w", f, err)
		}
		if n := yamlPath(&d.node, "ratelimitly", "credentials"); n != nil {
			n.Value = copyPath
		}
	}
	d.path = filepath.Join(d.dir, "policy.yaml")
	if err := d.writePolicy(); err != nil {
		return nil, err
	}
	d.pol, err = admission.Load(d.path)
	if err != nil {
		return nil, fmt.Errorf("copy of %s: %w", srcPath, err)
	}
	for _, s := range d.pol.Services {
		if s.Name == svc.Name {
			d.svc = s
		}
	}
	d.proxy = "http://" + d.svc.Listen[0].String()
	return d, nil
}

// yamlPath finds the value node at a mapping path.
func yamlPath(n *yaml.Node, keys ...string) *yaml.Node {
	if n.Kind == yaml.DocumentNode && len(n.Content) > 0 {
		n = n.Content[0]
	}
	for _, k := range keys {
		if n.Kind != yaml.MappingNode {
			return nil
		}
		var next *yaml.Node
		for i := 0; i+1 < len(n.Content); i += 2 {
			if n.Content[i].Value == k {
				next = n.Content[i+1]
			}
		}
		if next == nil {
			return nil
		}
		n = next
	}
	return n
}

func (d *demo) writePolicy() error {
	var b bytes.Buffer
	enc := yaml.NewEncoder(&b)
	enc.SetIndent(2)
	if err := enc.Encode(&d.node); err != nil {
		return err
	}
	tmp := d.path + ".tmp"
	if err := os.WriteFile(tmp, b.Bytes(), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, d.path) // atomic, like a ConfigMap update
}

func (d *demo) printf(format string, args ...any) { fmt.Fprintf(d.out, format, args...) }

// start runs the sample upstream and the product.
func (d *demo) start() error {
	ln, err := net.Listen("tcp", d.upAddr)
	if err != nil {
		return fmt.Errorf("sample upstream on %s (the policy's upstream): %w", d.upAddr, err)
	}
	d.up = &http.Server{Handler: http.HandlerFunc(d.upstream), ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = d.up.Serve(ln) }()
	d.rt, err = node.Start(context.Background(), d.pol, node.Options{Policy: d.path, Admin: "127.0.0.1:0", Log: d.log, Watch: true, Version: d.version, Commit: d.commit, EventLoops: d.loops})
	if err != nil {
		return err
	}
	d.printf("rl-tproxy demo (policy %s, copied to %s)\n\n", d.srcPath, d.path)
	d.printf("  sample upstream    http://%s  (in-process; slow it down: curl -X POST 'http://%s/_demo/slow?ms=300')\n", d.upAddr, d.upAddr)
	if e := d.rt.Embedded(); e != nil {
		d.printf("  RateLimitly        embedded server udp %s, found through SRV %s at DNS %s\n", e.Server.Addr(), strings.TrimSuffix(e.SRV, "."), e.Resolver)
	}
	d.printf("  proxy              %s  (service %q, listener mode)\n", d.proxy, d.svc.Name)
	if a := d.rt.AdminAddr(); a != nil {
		d.printf("  admin              http://%s/metrics  /healthz  /readyz\n", a)
	}
	// Wait (bounded) for discovery so the first requests get decisions.
	deadline := time.Now().Add(10 * time.Second)
	ready, derr := d.rt.Decides()
	for !ready && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
		ready, derr = d.rt.Decides()
	}
	if !ready {
		return fmt.Errorf("embedded RateLimitly not discovered within 10s: %v", derr)
	}
	return nil
}

// upstream is the sample service: it answers every path, after the
// configured delay; POST /_demo/slow?ms=N sets the delay.
func (d *demo) upstream(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path == "/_demo/slow" {
		ms, _ := strconv.Atoi(r.URL.Query().Get("ms"))
		d.slow.Store(int64(time.Duration(ms) * time.Millisecond))
		fmt.Fprintf(w, "sample upstream delay now %dms\n", ms)
		return
	}
	if dl := time.Duration(d.slow.Load()); dl > 0 {
		time.Sleep(dl) // the demo's simulated slow service
	}
	fmt.Fprintf(w, "hello from the sample upstream: %s %s\n", r.Method, r.URL.Path)
}

type result struct {
	status                           int
	retryAfter, policyField, rlField string
	took                             time.Duration
}

func (d *demo) do(method, path string) (result, error) {
	req, err := http.NewRequest(method, d.proxy+path, nil)
	if err != nil {
		return result{}, err
	}
	start := time.Now()
	resp, err := d.client.Do(req)
	if err != nil {
		return result{}, err
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return result{status: resp.StatusCode, retryAfter: resp.Header.Get("Retry-After"), policyField: resp.Header.Get("RateLimit-Policy"),
		rlField: resp.Header.Get("RateLimit"), took: time.Since(start)}, nil
}

// findLocation returns the first location that satisfies want.
func (d *demo) findLocation(want func(*admission.Location) bool) *admission.Location {
	for _, l := range d.svc.Locations {
		if want(l) {
			return l
		}
	}
	return nil
}

func pathFor(l *admission.Location, leaf string) string {
	switch {
	case l.Match.Path != "":
		return l.Match.Path
	case l.Match.PathPrefix != "":
		return strings.TrimSuffix(l.Match.PathPrefix, "/") + "/" + leaf
	}
	return "/" + leaf
}

func methodFor(l *admission.Location) string {
	if len(l.Match.Methods) > 0 {
		return l.Match.Methods[0]
	}
	return "GET"
}

func (d *demo) script() error {
	step := 0
	next := func(title string) {
		step++
		d.printf("\n%d. %s\n", step, title)
	}
	// Unprotected location.
	if l := d.findLocation(func(l *admission.Location) bool { return !l.Protected() && len(l.Match.Headers) == 0 }); l != nil {
		next(fmt.Sprintf("Unprotected location %q: no RateLimitly request", l.Name))
		r, err := d.do(methodFor(l), pathFor(l, "x"))
		if err != nil {
			return err
		}
		d.printf("   %s %s -> %d\n", methodFor(l), pathFor(l, "x"), r.status)
	}
	// Burst against a rate limit.
	limited := d.findLocation(func(l *admission.Location) bool {
		return len(l.Limits) > 0 && len(l.Guards) == 0 && len(l.Match.Headers) == 0 && l.Mode == admission.ModeEnforce &&
			staticZone(l.Limits[0])
	})
	if limited != nil {
		if err := d.burst(next, limited, "Burst"); err != nil {
			return err
		}
	}
	// Latency guard.
	if l := d.findLocation(func(l *admission.Location) bool {
		return len(l.Guards) > 0 && l.Report != nil && len(l.Match.Headers) == 0 && l.Mode == admission.ModeEnforce
	}); l != nil {
		if err := d.guard(next, l); err != nil {
			return err
		}
	}
	// Live reload.
	if limited != nil {
		if err := d.reload(next, limited); err != nil {
			return err
		}
	}
	return nil
}

// staticZone reports whether z has one rate and burst for every request
// (no tier) and a bucket the demo's requests can render (no client
// header, cookie or query value): the burst and the reload steps count on
// both.
func staticZone(z *admission.Zone) bool {
	return z.RateTier == nil && z.BurstTier == nil && z.CostTier == nil && z.Bucket.ClientValue() == ""
}

func (d *demo) burst(next func(string), l *admission.Location, what string) error {
	z := l.Limits[0]
	burst := z.Burst
	if burst == 0 {
		burst = z.Rate
	}
	n := int(burst) + 10
	method, path := methodFor(l), pathFor(l, "items")
	next(fmt.Sprintf("%s: %d × %s %s (location %q, zone %q: %d per %s, burst %d)", what, n, method, path, l.Name, z.Name, z.Rate, time.Duration(z.PeriodMs)*time.Millisecond, burst))
	counts := map[int]int{}
	var firstDeny *result
	for i := 0; i < n; i++ {
		r, err := d.do(method, path)
		if err != nil {
			return err
		}
		counts[r.status]++
		if r.status != 200 && firstDeny == nil {
			firstDeny = &r
		}
	}
	d.printf("   allowed (200): %d   denied (%d): %d\n", counts[200], l.Deny.Status, counts[l.Deny.Status])
	if firstDeny != nil {
		d.printf("   first deny: %d  Retry-After: %s\n", firstDeny.status, firstDeny.retryAfter)
		d.printf("               RateLimit-Policy: %s\n", firstDeny.policyField)
		d.printf("               RateLimit: %s\n", firstDeny.rlField)
	}
	return nil
}

func ms(d time.Duration) string {
	if d < time.Millisecond {
		return "<1ms"
	}
	return d.Round(time.Millisecond).String()
}

func (d *demo) reports() uint64 {
	e := d.rt.Embedded()
	if e == nil {
		return 0
	}
	return e.Server.Stats().Reports
}

func (d *demo) guard(next func(string), l *admission.Location) error {
	g := l.Guards[0]
	method, path := methodFor(l), pathFor(l, "order")
	next(fmt.Sprintf("Latency guard on %s %s (location %q: tracker %q must stay at or under %s; reports feed it)", method, path, l.Name, g.Tracker.Name, g.Threshold))
	before := d.reports()
	for i := 0; i < 3; i++ {
		r, err := d.do(method, path)
		if err != nil {
			return err
		}
		d.printf("   fast upstream: %s %s -> %d in %s\n", method, path, r.status, ms(r.took))
	}
	slow := g.Threshold + g.Threshold/5 + 50*time.Millisecond
	d.slow.Store(int64(slow))
	d.printf("   upstream slowed to %s\n", slow)
	tripped := false
	for i := 0; i < 10 && !tripped; i++ {
		r, err := d.do(method, path)
		if err != nil {
			return err
		}
		if r.status == l.Deny.Status {
			tripped = true
			d.printf("   %s %s -> %d in %s: guard tripped (Retry-After: %s), the upstream is spared\n", method, path, r.status, ms(r.took), r.retryAfter)
			continue
		}
		d.printf("   slow upstream: %s %s -> %d in %s (latency reported)\n", method, path, r.status, ms(r.took))
	}
	d.slow.Store(0)
	d.printf("   upstream fast again; latency reports received by RateLimitly during this step: %d\n", d.reports()-before)
	if !tripped {
		d.printf("   (the guard did not trip within 10 slow requests)\n")
	} else {
		d.printf("   the guard recovers once fast reports bring the tracker's p90 back under %s or the slow samples age out\n", g.Threshold)
	}
	return nil
}

func (d *demo) reload(next func(string), l *admission.Location) error {
	z := l.Limits[0]
	rate := yamlPath(&d.node, "zones", z.Name, "rate")
	if rate == nil {
		return errors.New("zone rate not found in the policy copy")
	}
	old := rate.Value
	rate.Value = "2/s"
	burstNode := yamlPath(&d.node, "zones", z.Name, "burst")
	if burstNode != nil {
		burstNode.Value = "3"
	} else {
		zn := yamlPath(&d.node, "zones", z.Name)
		zn.Content = append(zn.Content, &yaml.Node{Kind: yaml.ScalarNode, Value: "burst"}, &yaml.Node{Kind: yaml.ScalarNode, Value: "3"})
	}
	next(fmt.Sprintf("Live reload: zone %q rate %s -> 2/s, burst 3 (rewriting %s)", z.Name, old, d.path))
	if err := d.writePolicy(); err != nil {
		return err
	}
	// The file watcher reloads on its own; SIGHUP does the same. Poll the
	// generation (bounded), then reload explicitly if the watch missed it.
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		if _, gen := d.rt.Policy(); gen >= 2 {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if _, gen := d.rt.Policy(); gen < 2 {
		if err := d.rt.Reload(admission.TriggerSignal); err != nil {
			return fmt.Errorf("reload: %w", err)
		}
	}
	p, gen := d.rt.Policy()
	d.printf("   policy generation %d in force (%s)\n", gen, p.Summary())
	for _, s := range p.Services {
		if s.Name == d.svc.Name {
			d.svc = s
		}
	}
	nl := d.findLocation(func(x *admission.Location) bool { return x.Name == l.Name })
	if nl == nil {
		return errors.New("location vanished after reload")
	}
	// Demo pacing (not synchronisation): let the bucket refill to the new
	// burst so the new limit shows.
	d.printf("   waiting 1.5s for the bucket to refill at the new rate\n")
	time.Sleep(1500 * time.Millisecond)
	return d.burst(next, nl, "Burst after the reload")
}

func (d *demo) interactive() {
	d.printf("\nStill serving. Try (Ctrl-C to stop):\n")
	for _, l := range d.svc.Locations {
		m := methodFor(l)
		flag := ""
		if m != "GET" {
			flag = "-X " + m + " "
		}
		d.printf("  curl -i %s%s%s      # location %q\n", flag, d.proxy, pathFor(l, "x"), l.Name)
	}
	d.printf("  curl -X POST 'http://%s/_demo/slow?ms=300'   # slow the sample upstream (ms=0 restores)\n", d.upAddr)
	if a := d.rt.AdminAddr(); a != nil {
		d.printf("  curl -s http://%s/metrics | grep ^rl_tproxy_requests_total\n", a)
	}
	d.printf("  edit %s and save: the proxy reloads it live\n", d.path)
	hup := make(chan os.Signal, 1)
	term := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	signal.Notify(term, syscall.SIGTERM, syscall.SIGINT)
	defer signal.Stop(hup)
	defer signal.Stop(term)
	for {
		select {
		case <-hup:
			d.rt.RequestReload() // on the node's reload worker: Ctrl-C stays prompt
		case <-term:
			d.printf("\nstopping\n")
			return
		}
	}
}

func (d *demo) close() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if d.rt != nil {
		_ = d.rt.Shutdown(ctx)
	}
	if d.up != nil {
		_ = d.up.Shutdown(ctx)
	}
	if d.dir != "" {
		os.RemoveAll(d.dir)
	}
}
