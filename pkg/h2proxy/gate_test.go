package h2proxy_test

import (
	"context"
	"crypto/rand"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/rl-tproxy/rl-tproxy/internal/testkit"
	"github.com/rl-tproxy/rl-tproxy/pkg/admission"
	"github.com/rl-tproxy/rl-tproxy/pkg/embedded"
	"github.com/rl-tproxy/rl-tproxy/pkg/exchange"
	"github.com/rl-tproxy/rl-tproxy/pkg/hook"
	"github.com/rl-tproxy/rl-tproxy/pkg/ratelimitly"
	"github.com/rl-tproxy/rl-tproxy/pkg/ratelimitly/credentials"
	"github.com/rl-tproxy/rl-tproxy/pkg/ratelimitly/wire"
	"github.com/rl-tproxy/rl-tproxy/pkg/rlclient"
)

// countingChecker counts the latency reports the gate sends.
type countingChecker struct {
	admission.Checker
	mu      sync.Mutex
	reports []string
}

func (c *countingChecker) Check(ctx context.Context, r *wire.RateRequest, out *admission.CheckResult) {
	c.Checker.Check(ctx, r, out)
}

func (c *countingChecker) Report(svc []byte, d time.Duration) {
	c.mu.Lock()
	c.reports = append(c.reports, string(svc))
	c.mu.Unlock()
	c.Checker.Report(svc, d)
}

func (c *countingChecker) count() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.reports)
}

// gateFor starts an embedded RateLimitly server and a hook.Gate with the
// given policy, its access log written to the returned buffer.
func gateFor(t *testing.T, policy string) (*hook.Gate, *countingChecker, *testkit.SyncBuffer) {
	t.Helper()
	var c credentials.Credential
	c.Tenant, c.KeyID = "h2", 1
	if _, err := rand.Read(c.Secret[:]); err != nil {
		t.Fatal(err)
	}
	e, err := embedded.Start(embedded.Config{Credentials: []credentials.Credential{c}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.Close() })
	cl, err := rlclient.New(rlclient.Config{SRV: e.SRV, Resolver: e.Resolver, Credential: c, Policy: ratelimitly.Standard(20 * time.Millisecond)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cl.Close() })
	testkit.WaitFor(t, "discovery", cl.Ready)
	path := filepath.Join(t.TempDir(), "policy.yaml")
	if err := os.WriteFile(path, []byte(policy), 0o600); err != nil {
		t.Fatal(err)
	}
	p, err := admission.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	buf := &testkit.SyncBuffer{}
	g := hook.New(hook.Config{AccessLog: slog.New(slog.NewTextHandler(buf, nil))})
	g.Swap(p)
	cc := &countingChecker{Checker: hook.NewClient(cl)}
	g.SetChecker(cc, nil)
	return g, cc, buf
}

// TestGateGRPC: the real gate over HTTP/2: per-stream admission against
// RateLimitly, a zone of 2 calls per minute lets two unary calls through
// and denies the third with RESOURCE_EXHAUSTED naming the zone and a
// pushback; every admitted stream sends its latency report; the access
// line says h2, the location and the outcome.
func TestGateGRPC(t *testing.T) {
	_, upAddr := startGRPC(t)
	g, cc, access := gateFor(t, `ratelimitly: {embedded: true}
zones:
  calls: {bucket: "calls:{host}", rate: 2/m, burst: 2}
trackers:
  lat: {service: "lat:{path}"}
services:
  - name: grpc
    listen: 127.0.0.1:1
    upstream: `+upAddr+`
    locations:
      - name: unary
        match: {path_prefix: /grpc.testing.TestService/UnaryCall}
        limit: [calls]
        report: lat
      - name: streams
        match: {path_prefix: /grpc.testing.TestService/}
        report: lat
`)
	svc := hook.ProxyServices(mustPolicy(g))[0]
	_, addr := startProxy(t, svc, g)
	cl := dialGRPC(t, addr)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for i := range 2 {
		if _, err := cl.UnaryCall(ctx, &testgrpc.SimpleRequest{}); err != nil {
			t.Fatalf("call %d: %v", i, err)
		}
	}
	var trl metadata.MD
	_, err := cl.UnaryCall(ctx, &testgrpc.SimpleRequest{}, grpc.Trailer(&trl))
	s, _ := status.FromError(err)
	if s.Code() != codes.ResourceExhausted || s.Message() != "rate limited by zone calls" {
		t.Fatalf("third call: %v", err)
	}
	pb := trl.Get("grpc-retry-pushback-ms")
	if len(pb) != 1 || pb[0] == "" || pb[0] == "0" || len(trl.Get("ratelimit")) != 1 {
		t.Errorf("pushback %v ratelimit %v", pb, trl.Get("ratelimit"))
	}
	// Streams of an unprotected location with report: one report each.
	bs, err := cl.FullDuplexCall(ctx)
	if err != nil {
		t.Fatal(err)
	}
	_ = bs.CloseSend()
	if _, err := bs.Recv(); err == nil {
		t.Fatal("bidi: a message from nowhere")
	}
	testkit.WaitFor(t, "3 reports (2 allowed unary + 1 stream; none for the deny)", func() bool { return cc.count() == 3 })
	testkit.WaitFor(t, "4 access lines", func() bool { return strings.Count(access.String(), "msg=access") == 4 })
	log := access.String()
	for _, want := range []string{"location=unary", "outcome=deny", "location=streams", "proto=h2"} {
		if !strings.Contains(log, want) {
			t.Errorf("access log lacks %q:\n%s", want, log)
		}
	}
	if m := g.Metrics(); m == nil {
		t.Fatal("no metrics")
	}
}

func mustPolicy(g *hook.Gate) *admission.Policy {
	p, _ := g.Policy()
	return p
}

var _ exchange.Hook = (*hook.Gate)(nil)

var _ exchange.ContextBound = (*hook.Gate)(nil)
