package rlserver

import (
	"bytes"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rl-tproxy/rl-tproxy/internal/testkit"
	"github.com/rl-tproxy/rl-tproxy/pkg/ratelimitly/credentials"
	"github.com/rl-tproxy/rl-tproxy/pkg/ratelimitly/wire"
)

func TestBurstThenDenyAndRefill(t *testing.T) {
	clk := newClock()
	s := startServer(t, clk, nil)
	c := newClient(t, s, clk, testCred("acme", 1, 1))
	r := oneRes(res("client:1", 5, 1000, 5, 1))
	for i := 4; i >= 0; i-- {
		check(t, fmt.Sprintf("burst %d", i), c.do(r), want{true, uint32(i), 0, 0})
	}
	check(t, "6th", c.do(r), want{false, 0, 1, 200})
	clk.Advance(100 * time.Millisecond) // 0.5 tokens
	check(t, "t=100ms", c.do(r), want{false, 0, 1, 100})
	clk.Advance(100 * time.Millisecond) // 1 token
	check(t, "t=200ms", c.do(r), want{true, 0, 0, 0})
	clk.Advance(10 * time.Second) // refills to capacity, not beyond
	check(t, "refilled", c.do(r), want{true, 4, 0, 0})

	// burst 0 = capacity rate; cost 4
	r2 := oneRes(res("client:2", 10, 1000, 0, 4))
	check(t, "cost 4 #1", c.do(r2), want{true, 6, 0, 0})
	check(t, "cost 4 #2", c.do(r2), want{true, 2, 0, 0})
	check(t, "cost 4 #3", c.do(r2), want{false, 2, 2, 200})
	clk.Advance(150 * time.Millisecond) // 3.5 tokens
	check(t, "cost 4 #4", c.do(r2), want{false, 3, 1, 50})

	// tenants are separate namespaces
	c2 := newClient(t, s, clk, testCred("other", 2, 50))
	check(t, "other tenant", c2.do(r), want{true, 4, 0, 0})

	st := s.Stats()
	if st.Allows != 10 || st.Denies != 4 || st.Requests != 14 {
		t.Fatalf("stats %+v", st)
	}
}

func TestAllOrNothing(t *testing.T) {
	clk := newClock()
	s := startServer(t, clk, nil)
	c := newClient(t, s, clk, testCred("acme", 1, 1))
	big := res("big", 100, 1000, 100, 1)
	small := res("small", 1, 1000, 1, 1)
	both := &wire.RateRequest{Resources: []wire.Resource{big, small}}
	r := c.do(both)
	if !r.Success || r.Resources[0].Remaining != 99 || r.Resources[1].Remaining != 0 {
		t.Fatalf("first: %+v", r)
	}
	r = c.do(both)
	if r.Success || r.Resources[0].Remaining != 99 || r.Resources[0].TokensDeficit != 0 ||
		r.Resources[1].TokensDeficit != 1 || r.Resources[1].RetryAfterMs != 1000 {
		t.Fatalf("second: %+v", r)
	}
	check(t, "big untouched", c.do(oneRes(big)), want{true, 98, 0, 0})

	// the same bucket twice in one request sees the earlier cost
	twice := &wire.RateRequest{Resources: []wire.Resource{res("dup", 3, 1000, 3, 2), res("dup", 3, 1000, 3, 2)}}
	r = c.do(twice)
	if r.Success || r.Resources[0].TokensDeficit != 0 || r.Resources[1].TokensDeficit != 1 || r.Resources[0].Remaining != 3 {
		t.Fatalf("dup: %+v", r)
	}
	check(t, "dup untouched", c.do(oneRes(res("dup", 3, 1000, 3, 2))), want{true, 1, 0, 0})

	// a failing guard consumes nothing
	rep := &wire.LatencyReport{Entries: []wire.ReportEntry{{Service: []byte("slow"), DurationMs: 500}}}
	h := c.header(1)
	c.send(c.seal(&h, rep))
	guarded := &wire.RateRequest{Guards: []wire.Guard{{Service: []byte("slow"), ThresholdMs: 100}}, Resources: []wire.Resource{big}}
	r = c.do(guarded)
	if r.Success || r.Guards[0].Passed || r.Guards[0].ObservedMs != 500 || r.Resources[0].Remaining != 98 || r.Resources[0].TokensDeficit != 0 {
		t.Fatalf("guarded: %+v", r)
	}
	check(t, "big untouched by guard", c.do(oneRes(big)), want{true, 97, 0, 0})
}

func TestGuardPercentileAndWindow(t *testing.T) {
	clk := newClock()
	s := startServer(t, clk, nil)
	c := newClient(t, s, clk, testCred("acme", 1, 1))
	guard := func(th uint32) *wire.RateRequest {
		return &wire.RateRequest{Guards: []wire.Guard{{Service: []byte("checkout"), ThresholdMs: th}}}
	}
	r := c.do(guard(1))
	if !r.Success || !r.Guards[0].Passed || r.Guards[0].ObservedMs != 0 {
		t.Fatalf("no data must pass: %+v", r)
	}
	// 10 samples 10..100 in one report; p90 nearest rank = 9th = 90
	rep := &wire.LatencyReport{}
	for i := uint32(1); i <= 10; i++ {
		rep.Entries = append(rep.Entries, wire.ReportEntry{Service: []byte("checkout"), DurationMs: i * 10})
	}
	h := c.header(1)
	c.send(c.seal(&h, rep))
	if r := c.do(guard(90)); !r.Success || !r.Guards[0].Passed || r.Guards[0].ObservedMs != 90 {
		t.Fatalf("at threshold: %+v", r)
	}
	if r := c.do(guard(89)); r.Success || r.Guards[0].Passed || r.Guards[0].ObservedMs != 90 {
		t.Fatalf("over threshold: %+v", r)
	}
	// another tenant's tracker is separate
	c2 := newClient(t, s, clk, testCred("other", 2, 50))
	if r := c2.do(guard(1)); !r.Success {
		t.Fatalf("other tenant sees acme's tracker: %+v", r)
	}
	// a replayed report is dropped
	c.send(c.seal(&h, rep))
	c.sync()
	clk.Advance(trackerWindow + time.Millisecond)
	if r := c.do(guard(1)); !r.Success || r.Guards[0].ObservedMs != 0 {
		t.Fatalf("samples outside the window must not count: %+v", r)
	}
	st := s.Stats()
	if st.Reports != 1 || st.ReportEntries != 10 || st.Drops["replayed_report"] != 1 {
		t.Fatalf("stats: reports %d entries %d drops %v", st.Reports, st.ReportEntries, st.Drops)
	}
	s.sweep()
	if st := s.Stats(); st.Trackers != 0 {
		t.Fatalf("idle tracker not swept: %d", st.Trackers)
	}
}

func TestReplayReturnsSameAnswerConsumesOnce(t *testing.T) {
	clk := newClock()
	s := startServer(t, clk, nil)
	c := newClient(t, s, clk, testCred("acme", 1, 1))
	r := oneRes(res("b", 5, 1000, 5, 1))
	h := c.header(77)
	c.send(c.seal(&h, r))
	h1, r1, body1 := c.recv()
	clk.Advance(20 * time.Millisecond)
	h = c.header(77)
	h.Attempt, h.Flags = 1, wire.FlagReplay
	c.send(c.seal(&h, r))
	h2, r2, body2 := c.recv()
	if !bytes.Equal(body1, body2) {
		t.Fatalf("replay answer differs:\n%x\n%x", body1, body2)
	}
	if !r1.Success || r1.Resources[0].Remaining != 4 || r2.Resources[0].Remaining != 4 {
		t.Fatalf("answers %+v %+v", r1, r2)
	}
	if h2.Attempt != 1 || !h2.Replay() || h1.Replay() || h2.RequestID != 77 || h2.TTLms != 60 || !h2.Steering() || h1.Nonce == h2.Nonce {
		t.Fatalf("headers %+v %+v", h1, h2)
	}
	check(t, "consumed once", c.do(r), want{true, 3, 0, 0})
	if st := s.Stats(); st.Replays != 1 || st.Requests != 2 {
		t.Fatalf("stats %+v", st)
	}
	// Beyond ttl but inside the skew the id is still remembered (§12.1).
	clk.Advance(10 * time.Second)
	h = c.header(77)
	h.Timestamp = uint64(clk.Now().Add(-10 * time.Second).UnixMilli())
	c.send(c.seal(&h, r))
	if _, _, b := c.recv(); !bytes.Equal(b, body1) {
		t.Fatal("replay after ttl within skew was decided again")
	}
}

// A replay is answered from the dedup cache byte for byte whether the
// answer's body lives in its slot (one resource) or beside the ring (32
// resources: 396 bytes), and the request's buckets are charged once.
func TestReplayAnswerSizes(t *testing.T) {
	for _, n := range []int{1, 7, 8, 32} {
		t.Run(fmt.Sprintf("%d resources", n), func(t *testing.T) {
			clk := newClock()
			s := startServer(t, clk, nil)
			c := newClient(t, s, clk, testCred("acme", 1, 1))
			r := &wire.RateRequest{}
			for i := range n {
				r.Resources = append(r.Resources, res(fmt.Sprintf("b%d", i), 5, 1000, 5, 1))
			}
			h := c.header(99)
			c.send(c.seal(&h, r))
			_, r1, body1 := c.recv()
			if want := 12 + 12*n; len(body1) != want {
				t.Fatalf("answer body %d bytes, want %d", len(body1), want)
			}
			for i := range 3 {
				clk.Advance(time.Millisecond)
				h = c.header(99)
				h.Attempt, h.Flags = uint8(1+i), wire.FlagReplay
				c.send(c.seal(&h, r))
				if _, _, b := c.recv(); !bytes.Equal(b, body1) {
					t.Fatalf("replay %d answer differs:\n%x\n%x", i, b, body1)
				}
			}
			if !r1.Success || r1.Resources[n-1].Remaining != 4 {
				t.Fatalf("first answer %+v", r1)
			}
			if st := s.Stats(); st.Replays != 3 || st.Requests != 1 {
				t.Fatalf("stats %+v", st)
			}
		})
	}
}

func TestCompletion(t *testing.T) {
	clk := newClock()
	var lost atomic.Uint64
	s := startServer(t, clk, func(cfg *Config) {
		cfg.Hooks = &TestHooks{DropRequest: func(h *wire.Header) bool { return h.Kind == wire.KindRateRequest && h.RequestID == lost.Load() }}
	})
	c := newClient(t, s, clk, testCred("acme", 1, 1))
	r := oneRes(res("b", 5, 1000, 5, 2))

	// request 500 is lost; its allow completion consumes
	lost.Store(500)
	h := c.header(500)
	c.send(c.seal(&h, r))
	h = c.header(500)
	c.send(c.seal(&h, &wire.Completion{Decision: wire.DecisionAllow, Request: *r}))
	check(t, "after completion", c.do(r), want{true, 1, 0, 0})
	// a second completion for the same id is ignored
	h = c.header(500)
	c.send(c.seal(&h, &wire.Completion{Decision: wire.DecisionAllow, Request: *r}))
	// a completion for a request this server decided is ignored
	h = c.header(c.next)
	c.send(c.seal(&h, &wire.Completion{Decision: wire.DecisionAllow, Request: *r}))
	check(t, "ignored completions", c.do(r), want{false, 1, 1, 200})
	// allow completion never drives the bucket below zero
	h = c.header(501)
	c.send(c.seal(&h, &wire.Completion{Decision: wire.DecisionAllow, Request: *r}))
	c.sync()
	clk.Advance(400 * time.Millisecond) // 0 + 2 tokens
	check(t, "floor at zero", c.do(r), want{true, 0, 0, 0})
	// deny completion for an unseen id consumes nothing and pins the id to a deny
	clk.Advance(time.Second) // full: 5
	h = c.header(502)
	c.send(c.seal(&h, &wire.Completion{Decision: wire.DecisionDeny, Request: *r}))
	lost.Store(0)
	h = c.header(502)
	c.send(c.seal(&h, r))
	_, late, _ := c.recv()
	if late.Success || late.Resources[0].Remaining != 5 {
		t.Fatalf("late request after deny completion: %+v", late)
	}
	check(t, "deny completion consumed nothing", c.do(r), want{true, 3, 0, 0})
	st := s.Stats()
	if st.Completions != 5 || st.CompletionsApplied != 3 || st.CompletionsIgnored != 2 || st.Drops["hook"] != 1 {
		t.Fatalf("stats %+v", st)
	}
}

func TestEpochAndSteering(t *testing.T) {
	clk := newClock()
	var steer atomic.Bool
	var mutate atomic.Bool
	s := startServer(t, clk, func(cfg *Config) {
		cfg.Hooks = &TestHooks{
			ForceSteer: func(*wire.Header) bool { return steer.Load() },
			MutateResponse: func(r *wire.RateResponse) {
				if mutate.Load() {
					r.Resources = r.Resources[:0]
				}
			},
		}
	})
	if s.Epoch() != uint64(clk.Now().UnixMilli()) {
		t.Fatalf("epoch %d", s.Epoch())
	}
	c := newClient(t, s, clk, testCred("acme", 1, 1))
	r := oneRes(res("b", 10, 1000, 10, 1))
	h := c.header(1)
	c.send(c.seal(&h, r))
	if rh, resp, _ := c.recv(); !rh.Steering() || resp.ServerEpoch != s.Epoch() {
		t.Fatalf("steering %v epoch %d", rh.Steering(), resp.ServerEpoch)
	}
	steer.Store(true)
	mutate.Store(true)
	h = c.header(2)
	c.send(c.seal(&h, r))
	if rh, resp, _ := c.recv(); rh.Steering() || len(resp.Resources) != 0 {
		t.Fatalf("forced steering not applied: %v %+v", rh.Steering(), resp)
	}
	if s.Stats().Steered != 1 {
		t.Fatal("steered not counted")
	}
}

// The overload rule: OverloadTurns full batches in a row, cleared by a
// partial one; off without batching.
func TestOverloadRule(t *testing.T) {
	w := &worker{batch: 64}
	seq := []struct {
		n    int
		want bool
	}{{64, false}, {64, false}, {64, false}, {64, true}, {64, true}, {10, false}, {64, false}}
	for i, st := range seq {
		w.noteTurn(st.n)
		if w.overloaded != st.want {
			t.Fatalf("step %d: overloaded %v", i, w.overloaded)
		}
	}
	// One read of coalesced datagrams worth 7 full batches counts as 7
	// full turns.
	w = &worker{batch: 64}
	if w.noteTurn(480); !w.overloaded {
		t.Fatal("480 datagrams in one turn (7 full batches) not overloaded")
	}
	w = &worker{batch: 1}
	for i := 0; i < 10; i++ {
		w.noteTurn(1)
	}
	if w.overloaded {
		t.Fatal("batch 1 must never be overloaded")
	}
}

func TestBoundsAndSweep(t *testing.T) {
	clk := newClock()
	s := startServer(t, clk, func(cfg *Config) { cfg.MaxBuckets = nShards }) // one bucket per shard
	c := newClient(t, s, clk, testCred("acme", 1, 1))
	for i := 0; i < 3*nShards; i++ {
		c.do(oneRes(res(fmt.Sprintf("k%d", i), 10, 1000, 10, 1)))
	}
	st := s.Stats()
	if st.Buckets > nShards || st.BucketEvictions == 0 || st.Buckets+int64(st.BucketEvictions) != 3*nShards {
		t.Fatalf("buckets %d evictions %d", st.Buckets, st.BucketEvictions)
	}
	clk.Advance(50 * time.Millisecond) // 0.5 token short of full: kept
	s.sweep()
	if s.Stats().Buckets != st.Buckets {
		t.Fatal("sweep dropped buckets that are not full yet")
	}
	clk.Advance(wire.DefaultSkew + time.Second)
	s.sweep()
	if st := s.Stats(); st.Buckets != 0 || st.DedupEntries != 0 {
		t.Fatalf("after sweep: buckets %d dedup %d", st.Buckets, st.DedupEntries)
	}
}

func TestDedupCapacityBounded(t *testing.T) {
	clk := newClock()
	s := startServer(t, clk, func(cfg *Config) { cfg.DedupCapacity = nShards })
	c := newClient(t, s, clk, testCred("acme", 1, 1))
	for i := 0; i < 4*nShards; i++ {
		c.do(oneRes(res("b", 1000, 1000, 1000, 1)))
	}
	st := s.Stats()
	if st.DedupEntries > nShards || st.DedupEvictedLive == 0 {
		t.Fatalf("dedup %d evicted live %d", st.DedupEntries, st.DedupEvictedLive)
	}
}

// Many client sockets hitting one bucket through all workers: exactly the
// capacity is admitted (the clock is frozen).
func TestConcurrentAllowsExactlyCapacity(t *testing.T) {
	clk := newClock()
	s := startServer(t, clk, func(cfg *Config) { cfg.Workers = 4 })
	const clients, each, capacity = 8, 40, 100
	var allows atomic.Int64
	var wg sync.WaitGroup
	for i := 0; i < clients; i++ {
		c := newClient(t, s, clk, testCred("acme", 1, 1))
		c.next = uint64(i) << 32
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := oneRes(res("shared", capacity, 1000, capacity, 1))
			for j := 0; j < each; j++ {
				if c.do(r).Success {
					allows.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	if allows.Load() != capacity {
		t.Fatalf("allowed %d, want %d", allows.Load(), capacity)
	}
}

func TestWorkersShareOnePort(t *testing.T) {
	clk := newClock()
	s := startServer(t, clk, func(cfg *Config) { cfg.Workers = 3 })
	if s.Addr().Port() == 0 || s.Stats().Workers != 3 {
		t.Fatalf("addr %s workers %d", s.Addr(), s.Stats().Workers)
	}
	for _, w := range s.workers {
		if got := w.bc.conn.LocalAddr().(*net.UDPAddr).AddrPort(); got != s.Addr() {
			t.Fatalf("worker on %s, want %s", got, s.Addr())
		}
	}
	// a socket without SO_REUSEPORT cannot bind the port
	if _, err := net.ListenUDP("udp", net.UDPAddrFromAddrPort(s.Addr())); err == nil {
		t.Fatal("a plain socket could bind the server's port")
	}
}

func TestStartErrorsAndClose(t *testing.T) {
	good := []credentials.Credential{testCred("a", 1, 1)}
	for name, cfg := range map[string]Config{
		"no credentials": {Listen: "127.0.0.1:0"},
		"duplicate key":  {Listen: "127.0.0.1:0", Credentials: append(good, testCred("b", 1, 2))},
		"bad listen":     {Listen: "nope:xx", Credentials: good},
		"bad batch":      {Listen: "127.0.0.1:0", Credentials: good, Batch: 65},
		"bad workers":    {Listen: "127.0.0.1:0", Credentials: good, Workers: -1},
	} {
		if s, err := Start(cfg); err == nil {
			s.Close()
			t.Errorf("%s: no error", name)
		}
	}
	s, err := Start(Config{Listen: "127.0.0.1:0", Credentials: good})
	if err != nil {
		t.Fatal(err)
	}
	addr := s.Addr()
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal("second close:", err)
	}
	// the port is free again
	c, err := net.ListenUDP("udp", net.UDPAddrFromAddrPort(addr))
	if err != nil {
		t.Fatalf("port still bound after Close: %v", err)
	}
	c.Close()
}

func TestResolve(t *testing.T) {
	for in, want := range map[string]string{
		"127.0.0.1:0": "127.0.0.1:0", ":9000": "0.0.0.0:9000", "[::1]:5": "[::1]:5", "localhost:7": "127.0.0.1:7",
	} {
		got, err := resolve(in)
		if err != nil || got != netip.MustParseAddrPort(want) {
			t.Errorf("%s: %v %v, want %s", in, got, err, want)
		}
	}
}

func TestIPv6(t *testing.T) {
	c, err := net.ListenUDP("udp6", &net.UDPAddr{IP: net.IPv6loopback})
	if err != nil {
		testkit.Missing(t, "needs IPv6 loopback: %v", err)
	}
	c.Close()
	clk := newClock()
	s := startServer(t, clk, func(cfg *Config) { cfg.Listen = "[::1]:0" })
	cl := newClient(t, s, clk, testCred("acme", 1, 1))
	check(t, "v6", cl.do(oneRes(res("b", 2, 1000, 2, 1))), want{true, 1, 0, 0})
}

// Close answers what is already queued: loopback delivery is synchronous,
// so every request written before Close is either decided already or
// waiting in a socket queue that Close drains.
func TestCloseDrainsQueued(t *testing.T) {
	clk := newClock()
	s := startServer(t, clk, func(cfg *Config) { cfg.Workers = 1 })
	c := newClient(t, s, clk, testCred("acme", 1, 1))
	const n = 200
	r := oneRes(res("b", 1000, 1000, 1000, 1))
	for i := 0; i < n; i++ {
		h := c.header(uint64(10_000 + i))
		c.send(c.seal(&h, r))
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	seen := map[uint64]bool{}
	for i := 0; i < n; i++ {
		h, _, _ := c.recv()
		seen[h.RequestID] = true
	}
	if len(seen) != n {
		t.Fatalf("%d distinct answers, want %d", len(seen), n)
	}
	if st := s.Stats(); st.Responses != n {
		t.Fatalf("responses %d", st.Responses)
	}
}
