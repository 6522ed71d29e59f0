package hook

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rl-tproxy/rl-tproxy/internal/testkit"
	"github.com/rl-tproxy/rl-tproxy/pkg/admission"
	"github.com/rl-tproxy/rl-tproxy/pkg/exchange"
	"github.com/rl-tproxy/rl-tproxy/pkg/metrics"
	"github.com/rl-tproxy/rl-tproxy/pkg/passthrough"
	"github.com/rl-tproxy/rl-tproxy/pkg/ratelimitly/wire"
	"github.com/rl-tproxy/rl-tproxy/pkg/sniff"
)

const tlsPolicyYAML = `ratelimitly: {embedded: true, fail: close}
zones:
  per_sni: {bucket: "sni:{sni}:{alpn}:{remote_addr}", rate: 1/m, burst: 3}
trackers:
  conn: {service: "conn:{sni}"}
services:
  - name: tls
    port: 443
    upstream: 127.0.0.1:8443
    tls: passthrough
    locations:
      - name: api
        match: {sni: [api.example]}
        limit: [per_sni]
        report: conn
      - name: other
`

// TestGateTLSConnection: a TLS passthrough connection is admitted once
// through the Gate with its SNI and ALPN (location by SNI, bucket
// rendered from {sni}, {alpn}, {remote_addr}); Done reports the
// connection's duration and writes one access line with sni and alpn.
func TestGateTLSConnection(t *testing.T) {
	path := filepath.Join(t.TempDir(), "policy.yaml")
	if err := os.WriteFile(path, []byte(tlsPolicyYAML), 0o644); err != nil {
		t.Fatal(err)
	}
	pol, err := admission.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var buckets []string
	deny := false
	ck := &fakeChecker{fn: func(ctx context.Context, req *wire.RateRequest, out *admission.CheckResult) {
		mu.Lock()
		for _, r := range req.Resources {
			buckets = append(buckets, string(r.Bucket))
		}
		d := deny
		mu.Unlock()
		if d {
			denyResource(ctx, req, out)
		} else {
			allowAll(ctx, req, out)
		}
	}}
	logs := &testkit.SyncBuffer{}
	g := New(Config{Metrics: metrics.New("t", "t"), AccessLog: slog.New(slog.NewJSONHandler(logs, nil))})
	g.Swap(pol)
	g.SetChecker(ck, nil)
	svc := &exchange.Service{Name: "tls", Port: 443}
	start := time.Now().Add(-1500 * time.Millisecond) // a connection that lasted 1.5 s
	req := &exchange.Request{Remote: netip.MustParseAddrPort("192.0.2.7:5000"), Local: netip.MustParseAddrPort("10.0.0.1:443"),
		Service: svc, Start: start, Proto: exchange.ProtoTLSPassthrough, SNI: []byte("API.example"), ALPN: []byte("h2")}
	d := admitVia(g, context.Background(), req)
	if !d.Allow {
		t.Fatalf("denied: %+v", d)
	}
	g.Done(req, &d, &exchange.Result{End: start.Add(1500 * time.Millisecond), BytesIn: 10, BytesOut: 20, Upstream: "127.0.0.1:8443"})
	if ck.reports.Load() != 1 || ck.lastSvc != "conn:api.example" || ck.lastDur != 1500*time.Millisecond {
		t.Fatalf("report %d %q %v", ck.reports.Load(), ck.lastSvc, ck.lastDur)
	}
	mu.Lock()
	deny = true
	mu.Unlock()
	d = admitVia(g, context.Background(), req)
	if d.Allow {
		t.Fatal("allowed after a deny answer")
	}
	g.Done(req, &d, &exchange.Result{End: time.Now()})
	if ck.reports.Load() != 1 {
		t.Fatal("a denied connection was reported")
	}
	// Another SNI matches the unprotected location: no check.
	other := *req
	other.SNI = []byte("www.example")
	d = admitVia(g, context.Background(), &other)
	g.Done(&other, &d, &exchange.Result{End: time.Now()})
	if !d.Allow || ck.checks.Load() != 2 {
		t.Fatalf("other SNI: allow %v, %d checks", d.Allow, ck.checks.Load())
	}
	mu.Lock()
	if len(buckets) != 2 || buckets[0] != "sni:api.example:h2:192.0.2.7" {
		t.Fatalf("buckets %q", buckets)
	}
	mu.Unlock()
	lines := strings.Split(strings.TrimSpace(logs.String()), "\n")
	if len(lines) != 3 {
		t.Fatalf("%d access lines:\n%s", len(lines), logs.String())
	}
	var first, second map[string]any
	json.Unmarshal([]byte(lines[0]), &first)
	json.Unmarshal([]byte(lines[1]), &second)
	if first["sni"] != "API.example" || first["alpn"] != "h2" || first["proto"] != "tls-passthrough" ||
		first["location"] != "api" || first["verdict"] != "allow" || first["duration_ms"] != 1500.0 {
		t.Fatalf("allow line %v", first)
	}
	if second["verdict"] != "deny" || second["deny_zones"] != "per_sni" {
		t.Fatalf("deny line %v", second)
	}

	// Connections the Hook never saw: counted, one line each.
	g.ObserveConn(&passthrough.Event{Service: svc, Kind: sniff.Other, Action: passthrough.Rejected, Start: start, End: start})
	g.ObserveConn(&passthrough.Event{Service: svc, Kind: sniff.TLS, Action: passthrough.Relayed, Admitted: true})
	if n := strings.Count(logs.String(), "\n"); n != 4 {
		t.Fatalf("%d lines after ObserveConn, want 4", n)
	}
	if !strings.Contains(logs.String(), `"action":"rejected"`) {
		t.Fatalf("no rejected line:\n%s", logs.String())
	}
}
