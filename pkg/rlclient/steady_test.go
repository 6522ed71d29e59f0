package rlclient

import (
	"context"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/rl-tproxy/rl-tproxy/internal/dnstest"
	"github.com/rl-tproxy/rl-tproxy/internal/testkit"
	"github.com/rl-tproxy/rl-tproxy/pkg/ratelimitly"
	"github.com/rl-tproxy/rl-tproxy/pkg/ratelimitly/wire"
)

// startQuietNode is an allocation-free responder (allow, epoch 1) used
// to measure the client's own allocations: AllocsPerRun counts the whole
// process, so the peer must not allocate either.
func startQuietNode(t testing.TB) netip.AddrPort {
	t.Helper()
	conn, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	cred := testCred()
	key, _ := wire.NewKey(cred.KeyID, cred.Secret)
	done := make(chan struct{})
	go func() {
		defer close(done)
		buf := make([]byte, 2048)
		out := make([]byte, 0, wire.MaxDatagram)
		var h wire.Header
		var req wire.RateRequest
		resp := wire.RateResponse{ServerEpoch: 1, Success: true,
			Guards: make([]wire.GuardResult, 0, wire.MaxCount), Resources: make([]wire.ResourceResult, 0, wire.MaxCount)}
		for {
			n, from, err := conn.ReadFromUDPAddrPort(buf)
			if err != nil {
				return
			}
			if key.OpenBody(buf[:n], &h, &req) != nil {
				continue
			}
			resp.Guards = resp.Guards[:len(req.Guards)]
			for i := range resp.Guards {
				resp.Guards[i] = wire.GuardResult{Passed: true, ObservedMs: 1}
			}
			resp.Resources = resp.Resources[:len(req.Resources)]
			for i := range resp.Resources {
				resp.Resources[i] = wire.ResourceResult{Remaining: 9}
			}
			rh := wire.Header{Flags: wire.FlagSteering | h.Flags&wire.FlagReplay, Attempt: h.Attempt, TTLms: h.TTLms,
				RequestID: h.RequestID, Timestamp: uint64(time.Now().UnixMilli())}
			pkt, err := key.Seal(out[:0], &rh, &resp)
			if err == nil {
				conn.WriteToUDPAddrPort(pkt, from)
			}
		}
	}()
	t.Cleanup(func() { conn.Close(); <-done })
	return conn.LocalAddr().(*net.UDPAddr).AddrPort()
}

func TestCheckZeroAllocsSteadyState(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts are not meaningful under -race (the non-race run checks them)")
	}
	d := dnstest.Start(t)
	d.SetSRV(testSRV, targetsFor(startQuietNode(t), startQuietNode(t), startQuietNode(t))...)
	c := newTestClient(t, d.Addr(), clientOpts{shards: 1})
	waitReady(t, c)
	req := testRequest()
	var dec Decision
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	check := func() {
		if err := c.Check(ctx, req, &dec); err != nil {
			t.Fatalf("check: %v", err)
		}
	}
	for i := 0; i < 500; i++ {
		check()
	}
	if a := testing.AllocsPerRun(1000, check); a != 0 {
		t.Errorf("allocs per Check = %v, want 0", a)
	}
	svc := []byte("svc-a")
	report := func() { c.Report(svc, 5*time.Millisecond) }
	for i := 0; i < 100; i++ {
		report()
	}
	if a := testing.AllocsPerRun(200, report); a != 0 {
		t.Errorf("allocs per Report = %v, want 0", a)
	}
}

func countFDs(t testing.TB) int {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		testkit.Missing(t, "needs /proc/self/fd: %v", err)
	}
	return len(ents)
}

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
	baseFD := countFDs(t)

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
	waitFor(t, "goroutines back to baseline", func() bool { return runtime.NumGoroutine() <= baseG })
	waitFor(t, "descriptors back to baseline", func() bool { return countFDs(t) <= baseFD })
	live := 0
	for i := range c.table.stripes {
		s := &c.table.stripes[i]
		s.mu.Lock()
		live += len(s.m)
		s.mu.Unlock()
	}
	if live != 0 {
		t.Errorf("%d requests still in the table", live)
	}
}
