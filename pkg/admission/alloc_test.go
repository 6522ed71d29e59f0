//go:build !race

// Allocation tests (testing.AllocsPerRun). Their counts are meaningless
// under -race (the detector allocates, sync.Pool drops items), so this file
// is left out of the race run and `make test-alloc` runs it without -race.
// Every test here has "Alloc" in its name: that pass selects them by it.

package admission

import (
	"context"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/rl-tproxy/rl-tproxy/pkg/httpparse"
	"github.com/rl-tproxy/rl-tproxy/pkg/ratelimitly/wire"
)

func TestMatchNoAlloc(t *testing.T) {
	p := ptLoad(t, ptMatchPolicy)
	s := p.Services[0]
	r := ptRequest()
	r.Method = []byte("GET")
	r.Host = []byte("Admin.Example.com")
	r.Path = []byte("/api/x")
	r.Headers = ptHeaderBytes{{[]byte("X-Api-Key"), []byte("k")}, {[]byte("X-Env"), []byte("prod")}}
	var got *Location
	if n := testing.AllocsPerRun(200, func() { got = s.Match(r) }); n != 0 {
		t.Fatalf("Match allocates %v", n)
	}
	if got == nil || got.Name != "keyed" {
		t.Fatalf("matched %v", got)
	}
}

func TestLocalLimiterNoAllocSteadyState(t *testing.T) {
	l := NewLocalLimiter(nil, 0)
	zs := []LocalZone{{Zone: "z", Bucket: []byte("k"), Rate: 1e6, PeriodMs: 1000, Cost: 1}}
	out := make([]ZoneState, 1)
	l.Take(zs, out)
	if n := testing.AllocsPerRun(100, func() { l.Take(zs, out) }); n != 0 {
		t.Fatalf("Take allocates %v", n)
	}
}

func TestDecideNoAllocSteadyState(t *testing.T) {
	p, svc := testPolicy(t, FailLocal, ModeEnforce)
	e := &Engine{Checker: &scriptChecker{res: validResp(wire.StatusOK, false, okGuard, shortRes)}, Local: NewLocalLimiter(nil, 0)}
	r := testRequest(hdrs{"x-key": "alice", "x-label": "L"})
	var d Decision
	ctx := context.Background()
	e.Decide(ctx, p, svc, r, &d)
	if n := testing.AllocsPerRun(200, func() { e.Decide(ctx, p, svc, r, &d) }); n > 0 {
		t.Fatalf("Decide allocates %v per request", n)
	}
}

func TestDenyAnswerRenderNoAlloc(t *testing.T) {
	a := NewDenyAnswer(AnswerSpec{RateLimitHeaders: true, Zones: []AnswerZone{{Name: "a", Quota: 5, Window: time.Second}, {Name: "b", Quota: 9, Window: time.Second}}})
	hs := make([]httpparse.Header, 0, 3)
	buf := make([]byte, 0, AnswerBufSize)
	zs := []ZoneState{{Remaining: 1, RetryAfterMs: 1500, Known: true}, {Remaining: 123456, RetryAfterMs: 99, Known: true}}
	n := testing.AllocsPerRun(200, func() {
		hs, buf = a.Render(hs[:0], buf[:0], zs)
	})
	if n != 0 {
		t.Fatalf("Render allocates %v per run", n)
	}
}

func TestTemplateRenderNoAlloc(t *testing.T) {
	r := ptRequest()
	tm, err := CompileTemplate("c:{remote_addr}:{remote_port}|{host}|{method}{path}?{query.user}|{header.x-api-key}|{cookie.theme}|{server_addr}:{server_port}")
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 0, 512)
	n := testing.AllocsPerRun(200, func() {
		var err error
		buf, err = tm.Render(buf[:0], r)
		if err != nil {
			t.Fatal(err)
		}
	})
	if n != 0 {
		t.Fatalf("Render allocates %v times per run", n)
	}
	if !strings.Contains(string(buf), "192.0.2.7:40000|api.example.com|POST/api/v1/items?bob|k123|dark|10.0.0.1:8080") {
		t.Fatalf("rendered %q", buf)
	}
}

func TestServiceForNoAlloc(t *testing.T) {
	p := ptLoad(t, ptEmbedded+"services:\n  - {name: s1, port: 80, prefixes: [10.1.0.0/16], upstream: 127.0.0.1:80}\n")
	ap := netip.MustParseAddrPort("10.1.0.1:80")
	if n := testing.AllocsPerRun(100, func() { _ = p.ServiceFor(ap) }); n != 0 {
		t.Fatalf("ServiceFor allocates %v", n)
	}
}

// NormalizePath into a buffer with room allocates nothing.
func TestNormalizePathNoAlloc(t *testing.T) {
	buf := make([]byte, 0, 128)
	in := []byte("/%61pi//v1/./x/../items")
	if n := testing.AllocsPerRun(100, func() { buf, _ = NormalizePath(buf[:0], in) }); n != 0 || string(buf) != "/api/v1/items" {
		t.Fatalf("allocs %v, result %q", n, buf)
	}
}

// Matching through the location index allocates nothing.
func TestMatchIndexAlloc(t *testing.T) {
	s := manyLocations(1000)
	if s.index == nil {
		t.Fatal("not indexed")
	}
	r := &Request{Method: []byte("GET"), Path: []byte("/svc7/items")}
	if n := testing.AllocsPerRun(100, func() { s.Match(r) }); n != 0 {
		t.Fatalf("%v allocations", n)
	}
}

// A guard deny (with its probe bucket consulted) and its answer allocate
// nothing once warm.
func TestGuardDenyNoAlloc(t *testing.T) {
	p, svc := testPolicy(t, FailClose, ModeEnforce)
	svc.Locations[0].GuardProbe = newGuardProbe(probeRate{Rate: 1, PeriodMs: 3600000})
	e := &Engine{Checker: &scriptChecker{res: validResp(wire.StatusOK, false, badGuard, okRes)}}
	r := testRequest(hdrs{"x-key": "alice"})
	var d Decision
	ctx := context.Background()
	e.Decide(ctx, p, svc, r, &d)
	a := LocationAnswer(svc.Locations[0])
	hs := make([]httpparse.Header, 0, 3)
	buf := make([]byte, 0, AnswerBufSize)
	n := testing.AllocsPerRun(200, func() {
		e.Decide(ctx, p, svc, r, &d)
		hs, buf, _ = a.RenderDecision(hs[:0], buf[:0], &d)
	})
	if n != 0 || d.DenyKind() != DenyGuard {
		t.Fatalf("guard deny allocates %v per request (kind %d)", n, d.DenyKind())
	}
}

// Deciding an allow and rendering its RateLimit fields
// (ratelimit_headers: all) allocate nothing once the buffers have grown.
func TestDecideRenderAllowNoAlloc(t *testing.T) {
	p := ptLoad(t, rlFieldsPolicy)
	svc := rlFieldsService(t, p, "all")
	e := &Engine{Checker: &scriptChecker{res: validResp(wire.StatusOK, true, nil, []wire.ResourceResult{{Remaining: 4}, {Remaining: 3}, {Remaining: 2}})}}
	r := testRequest(hdrs{"x-key": "k"})
	a := LocationAnswer(svc.Locations[1])
	hs := make([]httpparse.Header, 0, 2)
	buf := make([]byte, 0, AnswerBufSize)
	var d Decision
	ctx := context.Background()
	run := func() {
		e.Decide(ctx, p, svc, r, &d)
		hs, buf = a.RenderAllow(hs[:0], buf[:0], &d)
	}
	run()
	if n := testing.AllocsPerRun(200, run); n != 0 {
		t.Fatalf("Decide+RenderAllow allocate %v per request", n)
	}
	if len(hs) != 2 || string(hs[1].Value) != `"per_client";r=3;t=4, "no_burst";r=2;t=20` {
		t.Fatalf("fields %v", hdrMap(hs))
	}
}
