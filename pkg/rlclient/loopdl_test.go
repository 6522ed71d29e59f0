package rlclient

import (
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/rl-tproxy/rl-tproxy/internal/dnstest"
	"github.com/rl-tproxy/rl-tproxy/internal/testkit"
	"github.com/rl-tproxy/rl-tproxy/internal/testkit/rlcluster"
	"github.com/rl-tproxy/rl-tproxy/pkg/ratelimitly"
	"github.com/rl-tproxy/rl-tproxy/pkg/ratelimitly/credentials"
	"github.com/rl-tproxy/rl-tproxy/pkg/ratelimitly/wire"
)

// TestLoopDeadlinesOrder: the loop shard's deadline structure hands its
// entries back in time order, whatever the order of the pushes (in order
// into the FIFO, earlier ones into the heap) and interleaved pops.
func TestLoopDeadlinesOrder(t *testing.T) {
	t0 := time.Unix(1000, 0)
	cases := []struct {
		name   string
		offset func(i int, rng *rand.Rand) time.Duration
	}{
		{"in order", func(i int, _ *rand.Rand) time.Duration { return time.Duration(i) * time.Millisecond }},
		{"reversed", func(i int, _ *rand.Rand) time.Duration { return time.Duration(1000-i) * time.Millisecond }},
		{"random", func(_ int, rng *rand.Rand) time.Duration { return time.Duration(rng.IntN(500)) * time.Millisecond }},
		{"mostly in order", func(i int, rng *rand.Rand) time.Duration {
			if rng.IntN(8) == 0 {
				return time.Duration(i-rng.IntN(50)) * time.Millisecond
			}
			return time.Duration(i) * time.Millisecond
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(1, 2))
			var d loopDeadlines
			var want []time.Time // pushed, not yet popped
			var got []time.Time
			for i := range 1000 {
				at := t0.Add(tc.offset(i, rng))
				d.push(loopEntry{at: at, seq: uint64(i)})
				want = append(want, at)
				if rng.IntN(3) == 0 { // pop the earliest now and then
					e, ok := d.peek()
					if !ok {
						t.Fatal("peek found nothing")
					}
					slices.SortFunc(want, func(a, b time.Time) int { return a.Compare(b) })
					if !e.at.Equal(want[0]) {
						t.Fatalf("push %d: earliest %v, want %v", i, e.at, want[0])
					}
					d.pop()
					want = want[1:]
				}
			}
			if d.size() != len(want) {
				t.Fatalf("size %d, want %d", d.size(), len(want))
			}
			for e, ok := d.peek(); ok; e, ok = d.peek() {
				got = append(got, e.at)
				d.pop()
			}
			slices.SortFunc(want, func(a, b time.Time) int { return a.Compare(b) })
			if !slices.EqualFunc(got, want, time.Time.Equal) {
				t.Fatalf("drained %d entries out of order", len(got))
			}
		})
	}
}

// startLoopCheck starts one check on loop i and returns its Pending.
func startLoopCheck(t *testing.T, h *loops, i int, out *Decision, rec *loopRec) Pending {
	t.Helper()
	var p Pending
	h.on(t, i, func() {
		var decided bool
		var err error
		if p, decided, err = h.c.CheckAsyncLoop(i, testRequest(), out, rec); decided {
			t.Errorf("decided at once: %v", err)
		}
	})
	return p
}

// goPending is the number of deadlines on shard i's timer goroutine.
func goPending(c *Client, i int) int {
	es := c.shards[i]
	es.mu.Lock()
	defer es.mu.Unlock()
	return es.pendingLocked()
}

// loopDeadlineState is what loop i's shard holds, read on the loop after
// a turn end (which drops the deadlines of checks that ended).
func loopDeadlineState(t *testing.T, h *loops, i int) (entries int, armed bool) {
	t.Helper()
	ls := h.c.loops[i]
	h.on(t, i, func() {})
	h.on(t, i, func() { entries, armed = ls.dl.size(), !ls.armed.IsZero() })
	return entries, armed
}

// TestLoopDeadlineReplayOnLoop (manual clock): a loop check's deadlines
// are on its loop, not on the timer goroutine; nothing happens before
// the round's end even when the loop's timer fires early; the replay
// goes out at the round's end; the horizon ends the check on the loop.
func TestLoopDeadlineReplayOnLoop(t *testing.T) {
	d, nodes := fakeCluster(t, 1)
	n := nodes[0]
	n.set(func(n *fakeNode) { n.drop = true })
	clk := newManualClock(time.Now())
	u := 20 * time.Millisecond
	c := newTestClient(t, d.Addr(), clientOpts{shards: 1, loops: 1, clock: clk, policy: ratelimitly.Standard(u)})
	waitReady(t, c)
	h := startLoops(t, c, 1)
	ls := c.loops[0]
	rec := newLoopRec(2)
	var out Decision
	startLoopCheck(t, h, 0, &out, rec)
	testkit.WaitFor(t, "the first send", func() bool { return n.count(wire.KindRateRequest) == 1 })
	if e, armed := loopDeadlineState(t, h, 0); e != 1 || !armed || goPending(c, 0) != 0 {
		t.Fatalf("loop deadlines %d (armed %v), timer goroutine %d; want 1 (armed), 0", e, armed, goPending(c, 0))
	}
	clk.Advance(u - time.Millisecond)
	sent := c.ring.Stats().Sent
	h.on(t, 0, ls.onDeadline) // an early fire: nothing is due
	h.on(t, 0, func() {})     // the turn end of the early fire has run
	if got := c.ring.Stats().Sent; got != sent {
		t.Fatalf("%d datagrams sent before the round's end", got-sent)
	}
	clk.Advance(time.Millisecond) // U: the replay, from the loop
	testkit.WaitFor(t, "the replay", func() bool { return n.count(wire.KindRateRequest) == 2 })
	if rs := n.received(); rs[1].attempt != 1 || !rs[1].replay {
		t.Fatalf("replay datagram %+v", rs[1])
	}
	if goPending(c, 0) != 0 {
		t.Fatal("the replay round's deadline went to the timer goroutine")
	}
	clk.Advance(2 * u) // the horizon
	got := rec.next(t)
	if !got.onLoop || got.gid != h.gids[0] || got.cause != CauseTimeout || out.Attempts != 2 {
		t.Fatalf("horizon: %+v, attempts %d; want a timeout on the loop after 2 attempts", got, out.Attempts)
	}
	if e, armed := loopDeadlineState(t, h, 0); e != 0 || armed {
		t.Fatalf("after the check: %d loop deadlines, armed %v", e, armed)
	}
	if st := c.Stats(); st.LoopHandoffs != 0 || st.LoopDone != 1 {
		t.Fatalf("hand-offs %d, loop completions %d; want 0, 1", st.LoopHandoffs, st.LoopDone)
	}
	rec.none(t)
}

// TestLoopDeadlineAbortRace: Abort from another goroutine against the
// loop's deadline (the clock jumps past the horizon): Abort first, the
// deadline first, or both at once. Whoever wins, the Completer is called
// exactly once and nothing stays in flight or armed.
func TestLoopDeadlineAbortRace(t *testing.T) {
	d, nodes := fakeCluster(t, 1)
	nodes[0].set(func(n *fakeNode) { n.drop = true })
	clk := newManualClock(time.Now())
	u := 10 * time.Millisecond
	c := newTestClient(t, d.Addr(), clientOpts{shards: 1, loops: 1, clock: clk, policy: ratelimitly.Standard(u)})
	waitReady(t, c)
	h := startLoops(t, c, 1)
	rec := newLoopRec(4)
	cases := []struct {
		name  string
		want  Cause // 0: either
		runs  int
		abort func(p Pending) loopDone
	}{
		{"abort first", CauseCancelled, 10, func(p Pending) loopDone {
			c.Abort(p)
			got := rec.next(t)
			clk.Advance(3 * u) // fires the loop's timer for a dead deadline
			return got
		}},
		{"deadline first", CauseTimeout, 10, func(p Pending) loopDone {
			clk.Advance(3 * u)
			got := rec.next(t)
			c.Abort(p) // the check is over: nothing happens
			return got
		}},
		{"together", 0, 200, func(p Pending) loopDone {
			// The loop is held while the clock passes the horizon, so
			// its deadline runs when it is let go, as Abort does.
			gate := make(chan struct{})
			h.g.Loops()[0].Post(func() { <-gate })
			clk.Advance(3 * u)
			var wg sync.WaitGroup
			wg.Add(1)
			go func() { defer wg.Done(); c.Abort(p) }()
			close(gate)
			wg.Wait()
			return rec.next(t)
		}},
	}
	for _, tc := range cases {
		causes := map[Cause]int{}
		for range tc.runs {
			var out Decision
			got := tc.abort(startLoopCheck(t, h, 0, &out, rec))
			if got.cause != CauseCancelled && got.cause != CauseTimeout || tc.want != 0 && got.cause != tc.want {
				t.Fatalf("%s: %+v", tc.name, got)
			}
			if got.cause == CauseTimeout && (!got.onLoop || got.gid != h.gids[0]) {
				t.Fatalf("%s: a timeout off the loop: %+v", tc.name, got)
			}
			causes[got.cause]++
			h.on(t, 0, func() {}) // a posted deadline, if any, has run
			rec.none(t)
			if f := c.Stats().InFlight; f != 0 {
				t.Fatalf("%s: %d checks in flight", tc.name, f)
			}
		}
		if e, armed := loopDeadlineState(t, h, 0); e != 0 || armed {
			t.Fatalf("%s: %d loop deadlines left, armed %v", tc.name, e, armed)
		}
		t.Logf("%s: outcomes %v", tc.name, causes)
	}
}

// TestLoopDeadlineAbortRaceWallClock: the same race on the loop's own
// timer: checks with a short horizon, each aborted from another
// goroutine as soon as it started.
func TestLoopDeadlineAbortRaceWallClock(t *testing.T) {
	d, nodes := fakeCluster(t, 1)
	nodes[0].set(func(n *fakeNode) { n.drop = true })
	c := newTestClient(t, d.Addr(), clientOpts{shards: 1, loops: 1, policy: ratelimitly.SingleRound(time.Millisecond)})
	waitReady(t, c)
	h := startLoops(t, c, 1)
	const n = 200
	rec := newLoopRec(n)
	outs := make([]Decision, n)
	ps := make(chan Pending, n)
	go func() {
		for p := range ps {
			c.Abort(p)
		}
	}()
	for i := range n {
		ps <- startLoopCheck(t, h, 0, &outs[i], rec)
	}
	close(ps)
	for range n {
		if got := rec.next(t); got.cause != CauseCancelled && got.cause != CauseTimeout {
			t.Fatalf("cause %v", got.cause)
		}
	}
	testkit.WaitFor(t, "no check in flight", func() bool { return c.Stats().InFlight == 0 })
	h.on(t, 0, func() {})
	rec.none(t)
	if e, armed := loopDeadlineState(t, h, 0); e != 0 || armed {
		t.Fatalf("after the race: %d loop deadlines, armed %v", e, armed)
	}
}

// TestLoopCloseWhileAttached: Close with loop checks in flight and the
// loop still attached: each check ends once, cancelled; the loop drops
// their deadlines at its next turn end and its timer is disarmed.
func TestLoopCloseWhileAttached(t *testing.T) {
	d, nodes := fakeCluster(t, 1)
	nodes[0].set(func(n *fakeNode) { n.drop = true })
	c := newTestClient(t, d.Addr(), clientOpts{shards: 1, loops: 1, policy: ratelimitly.Standard(10 * time.Second)})
	waitReady(t, c)
	h := startLoops(t, c, 1)
	rec := newLoopRec(10)
	startLoopChecks(t, h, 0, 10, rec)
	if e, armed := loopDeadlineState(t, h, 0); e != 10 || !armed {
		t.Fatalf("%d loop deadlines (armed %v), want 10", e, armed)
	}
	c.Close()
	for range 10 {
		if got := rec.next(t); got.cause != CauseCancelled || got.onLoop {
			t.Fatalf("closed: %+v", got)
		}
	}
	if e, armed := loopDeadlineState(t, h, 0); e != 0 || armed {
		t.Fatalf("after Close: %d loop deadlines, armed %v; want none", e, armed)
	}
	h.stop(t)
	rec.none(t)
	if st := c.Stats(); st.LoopHandoffs != 10 {
		t.Fatalf("hand-offs %d, want 10 (Close ends them off the loop)", st.LoopHandoffs)
	}
}

// TestLoopDetachWithChecksPending: the loop detaches with checks in
// flight: their deadlines move to the shard's timer goroutine, which
// ends them there (hand-offs), each exactly once.
func TestLoopDetachWithChecksPending(t *testing.T) {
	d, nodes := fakeCluster(t, 1)
	nodes[0].set(func(n *fakeNode) { n.drop = true })
	clk := newManualClock(time.Now())
	u := 20 * time.Millisecond
	c := newTestClient(t, d.Addr(), clientOpts{shards: 1, loops: 1, clock: clk, policy: ratelimitly.Standard(u)})
	waitReady(t, c)
	h := startLoops(t, c, 1)
	rec := newLoopRec(5)
	startLoopChecks(t, h, 0, 5, rec)
	h.on(t, 0, h.detach[0])
	h.detach[0] = nil
	if got := goPending(c, 0); got != 5 {
		t.Fatalf("%d deadlines on the timer goroutine after the detach, want 5", got)
	}
	if e, armed := loopDeadlineState(t, h, 0); e != 0 || armed {
		t.Fatalf("detached loop keeps %d deadlines, armed %v", e, armed)
	}
	clk.Advance(3 * u)
	for range 5 {
		if got := rec.next(t); got.onLoop || got.gid == h.gids[0] || got.cause != CauseTimeout {
			t.Fatalf("after the detach: %+v, want a timeout off the loop", got)
		}
	}
	rec.none(t)
	if st := c.Stats(); st.LoopHandoffs != 5 || st.LoopDone != 0 {
		t.Fatalf("hand-offs %d, loop completions %d; want 5, 0", st.LoopHandoffs, st.LoopDone)
	}
}

// TestLoopDecidedChecksDisarm: checks decided by answers leave nothing
// armed: the loop does not wake up at their old deadlines.
func TestLoopDecidedChecksDisarm(t *testing.T) {
	cred := testCred()
	cl := rlcluster.Start(t, rlcluster.Config{Nodes: 1, SRV: testSRV, Credentials: []credentials.Credential{cred}})
	c := newTestClient(t, cl.DNS.Addr(), clientOpts{shards: 1, loops: 1})
	waitReady(t, c)
	h := startLoops(t, c, 1)
	rec := newLoopRec(16)
	startLoopChecks(t, h, 0, 16, rec)
	for range 16 {
		if got := rec.next(t); !got.onLoop || !got.cause.Decided() {
			t.Fatalf("%+v", got)
		}
	}
	var timerArmed bool
	var e int
	h.on(t, 0, func() {}) // a turn end after the last completion
	h.on(t, 0, func() { e, timerArmed = c.loops[0].dl.size(), c.loops[0].tm.(*evTimer).t.Armed() })
	if e != 0 || timerArmed {
		t.Fatalf("after 16 decided checks: %d loop deadlines, loop timer armed %v", e, timerArmed)
	}
}

// TestLoopTimerChoice: the wall clock uses the loop's timer, any other
// Clock its own timer, posted to the loop.
func TestLoopTimerChoice(t *testing.T) {
	d := dnstest.Start(t)
	for _, tc := range []struct {
		clock Clock
		wall  bool
	}{{nil, true}, {newManualClock(time.Now()), false}, {&countingClock{}, false}} {
		c := newTestClient(t, d.Addr(), clientOpts{shards: 1, loops: 1, clock: tc.clock})
		if _, ev := c.loops[0].tm.(*evTimer); ev != tc.wall {
			t.Errorf("clock %T: loop timer %T", tc.clock, c.loops[0].tm)
		}
		c.Close()
	}
}
