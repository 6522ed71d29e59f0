package rlserver

import (
	"testing"
	"time"

	"github.com/rl-tproxy/rl-tproxy/pkg/ratelimitly/wire"
)

// The Engine decides on virtual time: a burst, then denies with the
// server's deficit and retry arithmetic, a refill as the clock moves, and
// guards from reported latencies.
func TestEngineVirtualTime(t *testing.T) {
	t0 := time.Date(2026, 12, 7, 0, 0, 0, 0, time.UTC)
	e, err := NewEngine("t", t0, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	req := &wire.RateRequest{Resources: []wire.Resource{{Bucket: []byte("k:a"), Rate: 1, PeriodMs: 1000, Burst: 3, Cost: 1}}}
	for _, tc := range []struct {
		at      time.Duration
		success bool
		deficit uint32
		retry   uint32
	}{
		{0, true, 0, 0}, {0, true, 0, 0}, {0, true, 0, 0},
		{0, false, 1, 1000},
		{500 * time.Millisecond, false, 1, 500},
		{time.Second, true, 0, 0}, // one token back
		{time.Second, false, 1, 1000},
		{time.Hour, true, 0, 0},
	} {
		resp := e.Decide(req, t0.Add(tc.at))
		rr := resp.Resources[0]
		if resp.Success != tc.success || rr.TokensDeficit != tc.deficit || rr.RetryAfterMs != tc.retry || resp.ServerEpoch != uint64(t0.UnixMilli()) {
			t.Fatalf("at %v: %+v", tc.at, resp)
		}
	}
	g := &wire.RateRequest{Guards: []wire.Guard{{Service: []byte("svc"), ThresholdMs: 100}}}
	if !e.Decide(g, t0).Success {
		t.Fatal("guard without data denied")
	}
	for range 10 {
		e.Report([]byte("svc"), 300, t0)
	}
	if r := e.Decide(g, t0); r.Success || r.Guards[0].ObservedMs != 300 {
		t.Fatalf("slow service passed: %+v", r)
	}
	if !e.Decide(g, t0.Add(2*time.Minute)).Success {
		t.Fatal("samples outside the window still count")
	}
	if e.Buckets() != 1 {
		t.Fatalf("%d buckets", e.Buckets())
	}
	e.Sweep(t0.Add(2 * time.Hour))
	if e.Buckets() != 0 {
		t.Fatalf("%d buckets after a sweep", e.Buckets())
	}
	if _, err := NewEngine(string(make([]byte, 70000)), t0, 0, 0); err == nil {
		t.Fatal("huge tenant accepted")
	}
}
