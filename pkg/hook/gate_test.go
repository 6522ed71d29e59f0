package hook

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rl-tproxy/rl-tproxy/internal/testkit"
	"github.com/rl-tproxy/rl-tproxy/pkg/admission"
	"github.com/rl-tproxy/rl-tproxy/pkg/exchange"
	"github.com/rl-tproxy/rl-tproxy/pkg/httpparse"
	"github.com/rl-tproxy/rl-tproxy/pkg/proxy"
	"github.com/rl-tproxy/rl-tproxy/pkg/ratelimitly"
	"github.com/rl-tproxy/rl-tproxy/pkg/ratelimitly/wire"
)

// fakeChecker answers checks with fn and counts reports.
type fakeChecker struct {
	fn      func(ctx context.Context, req *wire.RateRequest, out *admission.CheckResult)
	checks  atomic.Int64
	reports atomic.Int64
	mu      sync.Mutex
	lastSvc string
	lastDur time.Duration
}

func (f *fakeChecker) Check(ctx context.Context, req *wire.RateRequest, out *admission.CheckResult) {
	f.checks.Add(1)
	f.fn(ctx, req, out)
}

func (f *fakeChecker) Report(svc []byte, d time.Duration) {
	f.reports.Add(1)
	f.mu.Lock()
	f.lastSvc, f.lastDur = string(svc), d
	f.mu.Unlock()
}

func allowAll(_ context.Context, req *wire.RateRequest, out *admission.CheckResult) {
	out.Valid = true
	out.Resp.Status, out.Resp.Success = wire.StatusOK, true
	out.Resp.Guards = out.Resp.Guards[:0]
	for range req.Guards {
		out.Resp.Guards = append(out.Resp.Guards, wire.GuardResult{Passed: true})
	}
	out.Resp.Resources = out.Resp.Resources[:0]
	for range req.Resources {
		out.Resp.Resources = append(out.Resp.Resources, wire.ResourceResult{Remaining: 9})
	}
}

func denyResource(ctx context.Context, req *wire.RateRequest, out *admission.CheckResult) {
	allowAll(ctx, req, out)
	out.Resp.Success = false
	for i := range out.Resp.Resources {
		out.Resp.Resources[i] = wire.ResourceResult{Remaining: 0, TokensDeficit: 1, RetryAfterMs: 2100}
	}
}

func failWith(c ratelimitly.Cause) func(context.Context, *wire.RateRequest, *admission.CheckResult) {
	return func(_ context.Context, _ *wire.RateRequest, out *admission.CheckResult) {
		out.Valid, out.Fail = false, c
	}
}

const testPolicyYAML = `ratelimitly:
  embedded: true
  fail: %s
zones:
  per_key: {bucket: "k:{header.x-key}", rate: 10/s, burst: 2}
trackers:
  api: {service: "api:{host}"}
services:
  - name: web
    listen: 127.0.0.1:1
    upstream: %s
    locations:
      - name: health
        match: {path: /healthz}
        report: api
      - name: open
        match: {path_prefix: /open}
      - name: shadow
        match: {path_prefix: /shadow}
        limit: [per_key]
        mode: shadow
        report: api
      - name: api
        match: {path_prefix: /}
        limit: [per_key]
        guard: [{tracker: api, threshold: 250ms}]
        report: api
`

type rig struct {
	g    *Gate
	p    *proxy.Proxy
	ck   *fakeChecker
	base string
	logs *testkit.SyncBuffer
	up   *httptest.Server
}

func loadPolicy(t *testing.T, dir, fail, upstream string) *admission.Policy {
	t.Helper()
	path := filepath.Join(dir, "policy.yaml")
	if err := os.WriteFile(path, []byte(fmt.Sprintf(testPolicyYAML, fail, upstream)), 0o644); err != nil {
		t.Fatal(err)
	}
	p, err := admission.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func newRig(t *testing.T, fail string, fn func(context.Context, *wire.RateRequest, *admission.CheckResult)) *rig {
	t.Helper()
	return newRigUpstream(t, fail, fn, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// The upstream's own (stricter) rate-limit fields must pass unchanged.
		w.Header().Set("RateLimit", `"upstream";r=1;t=9`)
		w.Header().Set("RateLimit-Policy", `"upstream";q=5;w=60`)
		fmt.Fprintf(w, "hello %s\n", r.URL.Path)
	}))
}

// newRigUpstream is newRig with the upstream's handler.
func newRigUpstream(t *testing.T, fail string, fn func(context.Context, *wire.RateRequest, *admission.CheckResult), h http.Handler, opts ...func(*proxy.Config)) *rig {
	t.Helper()
	up := httptest.NewServer(h)
	t.Cleanup(up.Close)
	r := &rig{ck: &fakeChecker{fn: fn}, logs: &testkit.SyncBuffer{}, up: up}
	pol := loadPolicy(t, t.TempDir(), fail, up.Listener.Addr().String())
	r.g = New(Config{AccessLog: slog.New(slog.NewJSONHandler(r.logs, nil))})
	r.g.Swap(pol)
	r.g.SetChecker(r.ck, nil)
	svcs := ProxyServices(pol)
	cfg := proxy.Config{Config: exchange.Config{Services: svcs, Hook: hookFor(r.g)}}
	for _, o := range opts {
		o(&cfg)
	}
	p, err := proxy.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := proxy.Listen(context.Background(), "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = p.Serve(ln, svcs[0]) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = p.Shutdown(ctx)
	})
	r.base = "http://" + ln.Addr().String()
	r.p = p
	return r
}

func (r *rig) get(t *testing.T, path, key string) *http.Response {
	t.Helper()
	req, _ := http.NewRequest("GET", r.base+path, nil)
	if key != "" {
		req.Header.Set("X-Key", key)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp
}

// accessLines parses the JSON access log, waiting (bounded) for n lines:
// Done runs after the response is written, so a line can trail the
// client's read by a moment.
func (r *rig) accessLines(t *testing.T, n int) []map[string]any {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		var out []map[string]any
		sc := bufio.NewScanner(strings.NewReader(r.logs.String()))
		for sc.Scan() {
			var m map[string]any
			if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
				t.Fatalf("access log line is not JSON: %q: %v", sc.Text(), err)
			}
			out = append(out, m)
		}
		if len(out) >= n || time.Now().After(deadline) {
			if len(out) < n {
				t.Fatalf("%d access lines, want %d", len(out), n)
			}
			return out
		}
		time.Sleep(5 * time.Millisecond) // bounded poll on observable state
	}
}

func TestAllowPassesUpstreamRateLimitUnchanged(t *testing.T) {
	r := newRig(t, "close", allowAll)
	resp := r.get(t, "/api/x", "alice")
	if resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	if got := resp.Header.Values("RateLimit"); len(got) != 1 || got[0] != `"upstream";r=1;t=9` {
		t.Fatalf("upstream RateLimit changed: %q", got)
	}
	if got := resp.Header.Values("RateLimit-Policy"); len(got) != 1 || got[0] != `"upstream";q=5;w=60` {
		t.Fatalf("upstream RateLimit-Policy changed: %q", got)
	}
	l := r.accessLines(t, 1)[0]
	if l["verdict"] != "allow" || l["outcome"] != "allow" || l["cause"] != "allow" || l["service"] != "web" || l["location"] != "api" || l["status"] != float64(200) {
		t.Fatalf("access line %v", l)
	}
	testkit.WaitFor(t, "one report after a valid allow", func() bool { return r.ck.reports.Load() == 1 })
	r.ck.mu.Lock()
	defer r.ck.mu.Unlock()
	if !strings.HasPrefix(r.ck.lastSvc, "api:127.0.0.1") || r.ck.lastDur < time.Millisecond {
		t.Fatalf("report %q %v", r.ck.lastSvc, r.ck.lastDur)
	}
}

func TestDenyAnswer(t *testing.T) {
	r := newRig(t, "open", denyResource)
	resp := r.get(t, "/api/x", "alice")
	if resp.StatusCode != 429 || resp.Header.Get("Retry-After") != "3" {
		t.Fatalf("status %d Retry-After %q", resp.StatusCode, resp.Header.Get("Retry-After"))
	}
	if got := resp.Header.Get("RateLimit-Policy"); got != `"per_key";q=10;w=1` {
		t.Fatalf("RateLimit-Policy %q", got)
	}
	if got := resp.Header.Get("RateLimit"); got != `"per_key";r=0;t=3` {
		t.Fatalf("RateLimit %q", got)
	}
	if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
		t.Fatalf("content type %q", ct)
	}
	l := r.accessLines(t, 1)[0]
	if l["verdict"] != "deny" || l["outcome"] != "deny" || l["cause"] != "deny_resource" || l["status"] != float64(429) {
		t.Fatalf("access line %v", l)
	}
	if r.ck.reports.Load() != 0 {
		t.Fatal("report after a deny")
	}
}

// Reports: after allow, fail-open, shadow admit and unprotected work;
// never after deny or fail-close; unprotected sends no check.
func TestReportRulesThroughProxy(t *testing.T) {
	for _, c := range []struct {
		name, fail, path string
		fn               func(context.Context, *wire.RateRequest, *admission.CheckResult)
		status           int
		outcome          string
		checks, reports  int64
	}{
		{"allow", "close", "/api", allowAll, 200, "allow", 1, 1},
		{"deny", "open", "/api", denyResource, 429, "deny", 1, 0},
		{"fail-open", "open", "/api", failWith(ratelimitly.CauseTimeout), 200, "fail_open", 1, 1},
		{"fail-close", "close", "/api", failWith(ratelimitly.CauseTimeout), 429, "fail_close", 1, 0},
		{"fail-local", "local", "/api", failWith(ratelimitly.CauseNoEndpoints), 200, "fail_local", 1, 1},
		{"internal", "open", "/api", failWith(ratelimitly.CauseInternal), 500, "internal_error", 1, 0},
		{"shadow deny", "close", "/shadow", denyResource, 200, "shadow_deny", 1, 1},
		{"unprotected", "close", "/healthz", allowAll, 200, "bypass", 0, 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := newRig(t, c.fail, c.fn)
			resp := r.get(t, c.path, "k1")
			if resp.StatusCode != c.status {
				t.Fatalf("status %d, want %d", resp.StatusCode, c.status)
			}
			l := r.accessLines(t, 1)[0]
			if l["outcome"] != c.outcome {
				t.Fatalf("outcome %v, want %s", l["outcome"], c.outcome)
			}
			testkit.WaitFor(t, "report count", func() bool { return r.ck.reports.Load() == c.reports })
			if r.ck.checks.Load() != c.checks || r.ck.reports.Load() != c.reports {
				t.Fatalf("checks %d reports %d, want %d %d", r.ck.checks.Load(), r.ck.reports.Load(), c.checks, c.reports)
			}
		})
	}
}

// A client that goes away during its check: no report, outcome client_abort.
func TestClientAbortNoReport(t *testing.T) {
	entered := make(chan struct{})
	r := newRig(t, "open", func(ctx context.Context, _ *wire.RateRequest, out *admission.CheckResult) {
		close(entered)
		<-ctx.Done()
		out.Valid, out.Fail = false, ratelimitly.CauseCancelled
	})
	c, err := net.Dial("tcp", strings.TrimPrefix(r.base, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(c, "GET /api/x HTTP/1.1\r\nHost: a\r\nX-Key: k\r\n\r\n")
	<-entered
	c.Close()
	l := r.accessLines(t, 1)[0]
	if l["outcome"] != "client_abort" || l["verdict"] != "-" {
		t.Fatalf("access line %v", l)
	}
	if r.ck.reports.Load() != 0 {
		t.Fatal("report after client abort")
	}
}

// A client that resets while its allowed request waits for the upstream's
// response: the exchange is cancelled, no report, outcome client_abort.
func TestClientAbortWaitingForUpstreamNoReport(t *testing.T) {
	entered := make(chan struct{})
	cancelled := make(chan struct{})
	r := newRigUpstream(t, "close", allowAll, http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		close(entered)
		<-req.Context().Done() // the proxy closed the upstream connection
		close(cancelled)
	}))
	c, err := net.Dial("tcp", strings.TrimPrefix(r.base, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(c, "GET /api/slow HTTP/1.1\r\nHost: a\r\nX-Key: k\r\n\r\n")
	<-entered
	if err := c.(*net.TCPConn).SetLinger(0); err != nil { // close with a reset
		t.Fatal(err)
	}
	c.Close()
	l := r.accessLines(t, 1)[0]
	// The check allowed it, but an aborted outcome has no verdict.
	if l["outcome"] != "client_abort" || l["verdict"] != "-" || l["cause"] != "allow" {
		t.Fatalf("access line %v, want outcome client_abort, verdict -, cause allow", l)
	}
	if r.ck.reports.Load() != 0 {
		t.Fatal("report after client abort")
	}
	select {
	case <-cancelled:
	case <-time.After(10 * time.Second): // hang guard
		t.Fatal("upstream exchange not cancelled")
	}
}

type closeCounter struct{ n atomic.Int64 }

func (c *closeCounter) Close() error { c.n.Add(1); return nil }

// Swapping the checker lets in-flight checks finish on the old one, which
// is closed only afterwards; new requests use the new one.
func TestSetCheckerDrainsOld(t *testing.T) {
	release := make(chan struct{})
	entered := make(chan struct{})
	r := newRig(t, "close", func(ctx context.Context, req *wire.RateRequest, out *admission.CheckResult) {
		close(entered)
		<-release
		allowAll(ctx, req, out)
	})
	oldCloser := &closeCounter{}
	r.g.SetChecker(r.ck, oldCloser)
	inflight := make(chan int, 1)
	go func() {
		resp, err := http.Get(r.base + "/api/x")
		if err != nil {
			inflight <- -1
			return
		}
		resp.Body.Close()
		inflight <- resp.StatusCode
	}()
	<-entered
	next := &fakeChecker{fn: denyResource}
	closed := r.g.SetChecker(next, nil)
	if oldCloser.n.Load() != 0 {
		t.Fatal("old checker closed with a check in flight")
	}
	if resp := r.get(t, "/api/y", "k"); resp.StatusCode != 429 {
		t.Fatalf("new request not on the new checker: %d", resp.StatusCode)
	}
	close(release)
	if code := <-inflight; code != 200 {
		t.Fatalf("in-flight request got %d", code)
	}
	select {
	case <-closed:
	case <-time.After(10 * time.Second):
		t.Fatal("old checker never closed")
	}
	if oldCloser.n.Load() != 1 {
		t.Fatalf("old checker closed %d times", oldCloser.n.Load())
	}
}

// A policy swap applies to new requests; a request in flight finishes
// under the generation it started with.
func TestSwapInflightKeepsGeneration(t *testing.T) {
	release := make(chan struct{})
	entered := make(chan struct{}, 1)
	var blocking atomic.Bool
	blocking.Store(true)
	r := newRig(t, "close", func(ctx context.Context, req *wire.RateRequest, out *admission.CheckResult) {
		if blocking.Load() {
			entered <- struct{}{}
			<-release
		}
		allowAll(ctx, req, out)
	})
	done := make(chan struct{})
	go func() {
		defer close(done)
		resp, err := http.Get(r.base + "/api/x")
		if err == nil {
			resp.Body.Close()
		}
	}()
	<-entered
	blocking.Store(false)
	gen := r.g.Swap(loadPolicy(t, t.TempDir(), "close", r.up.Listener.Addr().String()))
	if gen != 2 {
		t.Fatalf("generation %d", gen)
	}
	r.get(t, "/api/y", "k")
	close(release)
	<-done
	lines := r.accessLines(t, 2)
	gens := map[string]float64{}
	for _, l := range lines {
		gens[l["path"].(string)] = l["generation"].(float64)
	}
	if gens["/api/x"] != 1 || gens["/api/y"] != 2 {
		t.Fatalf("generations %v", gens)
	}
}

// countingChecker is a Checker that only counts reports (no copies).
type countingChecker struct {
	fn      func(context.Context, *wire.RateRequest, *admission.CheckResult)
	reports atomic.Int64
}

func (c *countingChecker) Check(ctx context.Context, req *wire.RateRequest, out *admission.CheckResult) {
	c.fn(ctx, req, out)
}

func (c *countingChecker) Report([]byte, time.Duration) { c.reports.Add(1) }

// quietGate is a gate whose access log is disabled (level above info).
func quietGate(t testing.TB, fail string, fn func(context.Context, *wire.RateRequest, *admission.CheckResult)) (*Gate, *exchange.Request) {
	g := New(Config{AccessLog: slog.New(slog.NewTextHandler(io.Discard, &slog.HandlerOptions{Level: slog.LevelError}))})
	dir, err := os.MkdirTemp("", "gate-bench-")
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "policy.yaml")
	if err := os.WriteFile(path, []byte(fmt.Sprintf(testPolicyYAML, fail, "127.0.0.1:9")), 0o644); err != nil {
		t.Fatal(err)
	}
	p, err := admission.Load(path)
	os.RemoveAll(dir)
	if err != nil {
		t.Fatal(err)
	}
	g.Swap(p)
	g.SetChecker(&countingChecker{fn: fn}, nil)
	var head httpparse.Request
	raw := []byte("GET /api/x HTTP/1.1\r\nHost: example.com\r\nX-Key: alice\r\n\r\n")
	if err := head.Parse(raw, httpparse.Limits{}); err != nil {
		t.Fatal(err)
	}
	svc := ProxyServices(p)[0]
	r := &exchange.Request{Remote: netip.MustParseAddrPort("10.0.0.1:4000"), Local: netip.MustParseAddrPort("127.0.0.1:8080"),
		Service: svc, Head: &head, Path: []byte("/api/x"), Start: time.Now()}
	return g, r
}

func BenchmarkAdmitDone(b *testing.B) {
	for _, c := range []struct {
		name string
		fn   func(context.Context, *wire.RateRequest, *admission.CheckResult)
	}{{"allow", allowAll}, {"deny", denyResource}} {
		b.Run(c.name, func(b *testing.B) {
			g, r := quietGate(b, "close", c.fn)
			ctx := context.Background()
			res := &exchange.Result{Status: 200, End: time.Now()}
			b.ReportAllocs()
			for b.Loop() {
				d := admitVia(g, ctx, r)
				g.Done(r, &d, res)
			}
		})
	}
}

// fail: local says so in the log (rate-limited) and in the metrics.
func TestLocalFallbackLogsAndCounts(t *testing.T) {
	g, r := quietGate(t, "local", failWith(ratelimitly.CauseNoEndpoints))
	var buf testkit.SyncBuffer
	g.log = slog.New(slog.NewTextHandler(&buf, nil))
	res := &exchange.Result{Status: 200, End: time.Now()}
	for i := 0; i < 4; i++ { // burst 2: allow, allow, deny, deny
		d := admitVia(g, context.Background(), r)
		if d.Allow != (i < 2) {
			t.Fatalf("request %d: allow %v", i, d.Allow)
		}
		g.Done(r, &d, res)
	}
	if n := strings.Count(buf.String(), "deciding with the local token buckets"); n != 1 {
		t.Fatalf("%d warnings, want 1:\n%s", n, buf.String())
	}
	fams, err := g.Metrics().Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, f := range fams {
		if f.GetName() == "rl_tproxy_local_fallback_total" {
			for _, m := range f.GetMetric() {
				got[m.GetLabel()[0].GetValue()] = m.GetCounter().GetValue()
			}
		}
	}
	if got["allow"] != 2 || got["deny"] != 2 {
		t.Fatalf("local fallback counters %v", got)
	}
}

// `debug: true` logs each decision at debug level; without it nothing.
func TestDebugDecisionLog(t *testing.T) {
	for _, debug := range []bool{false, true} {
		g, r := quietGate(t, "close", denyResource)
		var buf testkit.SyncBuffer
		g.log = slog.New(slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
		p, _ := g.Policy()
		cp := *p
		cp.RateLimitly.Debug = debug
		g.Swap(&cp)
		d := admitVia(g, context.Background(), r)
		g.Done(r, &d, &exchange.Result{Status: d.Status, End: time.Now()})
		out := buf.String()
		has := strings.Contains(out, `"msg":"decision"`) && strings.Contains(out, `"bucket":"k:alice"`) && strings.Contains(out, `"retry_after_ms":2100`)
		if has != debug {
			t.Fatalf("debug %v: decision log %q", debug, out)
		}
	}
}

// Locations match the normalized path, the one the upstream acts on:
// escapes of unreserved bytes, repeated slashes and dot segments cannot move
// a request to another location. Without normalization each of these raw
// targets would fall to the catch-all protected location and be denied.
func TestMatchOnNormalizedPath(t *testing.T) {
	r := newRig(t, "close", denyResource)
	for _, target := range []string{"/%68ealthz", "//healthz", "/x/../healthz", "/./healthz"} {
		conn, err := net.Dial("tcp", strings.TrimPrefix(r.base, "http://"))
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(conn, "GET %s HTTP/1.1\r\nHost: a\r\nX-Key: k\r\nConnection: close\r\n\r\n", target)
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		if err != nil {
			t.Fatalf("%s: %v", target, err)
		}
		resp.Body.Close()
		conn.Close()
		if resp.StatusCode != 200 {
			t.Errorf("%s: status %d, want 200 from the unprotected /healthz location", target, resp.StatusCode)
		}
	}
	for _, l := range r.accessLines(t, 4) {
		if l["location"] != "health" || l["outcome"] != "bypass" {
			t.Errorf("access line %v: want location health, outcome bypass", l)
		}
	}
	if n := r.ck.checks.Load(); n != 0 {
		t.Fatalf("%d RateLimitly checks for unprotected paths", n)
	}
}
