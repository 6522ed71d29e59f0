package rlclient

import (
	"context"
	"math/rand/v2"
	"runtime"
	"sync"
	"testing"

	"github.com/rl-tproxy/rl-tproxy/internal/testkit"
	"github.com/rl-tproxy/rl-tproxy/pkg/ratelimitly"
)

// TestNoLeaksAfterManyChecksWithCancellations runs 100k checks (10k under
// -race or -short, where each check costs ~20x more), a quarter of them
// cancelled at random points (before the call, or from another goroutine
// racing the answers), and requires the goroutine count, the open
// descriptors, the in-flight gauge and the request table to come back to
// their baseline. Timeouts are tolerated (an overloaded machine can delay
// answers past the horizon); any other non-decision cause fails.
func TestNoLeaksAfterManyChecksWithCancellations(t *testing.T) {
	total := 100_000
	if testing.Short() || raceEnabled {
		total = 10_000
	}
	cl := startCluster(t, 3, nil)
	cl.ctl[2].dropAttempt0.Store(true) // one node only answers replays: some checks stay pending longer
	c := newTestClient(t, cl.dns.Addr(), clientOpts{})
	waitReady(t, c)
	runtime.GC()
	baseG := runtime.NumGoroutine()
	baseFD := testkit.CountFDs(t)

	const workers = 32
	per := total / workers
	var wg sync.WaitGroup
	var mu sync.Mutex
	causes := map[Cause]int{}
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func(seed uint64) {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(seed, 99))
			req := testRequest()
			var dec Decision
			local := map[Cause]int{}
			for i := 0; i < per; i++ {
				switch rng.IntN(8) {
				case 0: // cancelled before the call
					ctx, cancel := context.WithCancel(context.Background())
					cancel()
					c.Check(ctx, req, &dec)
				case 1: // cancelled from another goroutine while in flight
					ctx, cancel := context.WithCancel(context.Background())
					done := make(chan struct{})
					go func() { runtime.Gosched(); cancel(); close(done) }()
					c.Check(ctx, req, &dec)
					<-done
				default:
					c.Check(context.Background(), req, &dec)
				}
				local[dec.Cause]++
			}
			mu.Lock()
			for k, v := range local {
				causes[k] += v
			}
			mu.Unlock()
		}(uint64(w))
	}
	wg.Wait()
	t.Logf("causes: %v", causes)
	if causes[CauseCancelled] == 0 || causes[CauseAllow]+causes[ratelimitly.CauseDenyResource] == 0 {
		t.Fatalf("want both cancellations and decisions: %v", causes)
	}
	for k := range causes {
		if k != CauseCancelled && k != CauseTimeout && !k.Decided() {
			t.Errorf("unexpected cause %v (%d)", k, causes[k])
		}
	}
	if st := c.Stats(); st.InFlight != 0 {
		t.Errorf("in flight after the run: %d", st.InFlight)
	}
	testkit.WaitFor(t, "goroutines back to baseline", func() bool { return runtime.NumGoroutine() <= baseG })
	testkit.WaitFor(t, "descriptors back to baseline", func() bool { return testkit.CountFDs(t) <= baseFD })
	live := 0
	for i := range c.table.stripes {
		s := &c.table.stripes[i]
		s.mu.Lock()
		live += s.n
		s.mu.Unlock()
	}
	if live != 0 {
		t.Errorf("%d requests still in the table", live)
	}
}
