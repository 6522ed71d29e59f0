package rlclient

import (
	"bytes"
	"net"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rl-tproxy/rl-tproxy/internal/dnstest"
	"github.com/rl-tproxy/rl-tproxy/internal/testkit"
	"github.com/rl-tproxy/rl-tproxy/internal/testkit/rlcluster"
	"github.com/rl-tproxy/rl-tproxy/pkg/evloop"
	"github.com/rl-tproxy/rl-tproxy/pkg/ratelimitly"
	"github.com/rl-tproxy/rl-tproxy/pkg/ratelimitly/credentials"
	"github.com/rl-tproxy/rl-tproxy/pkg/ratelimitly/wire"
)

// loops is an evloop group with the client attached to every loop.
type loops struct {
	c      *Client
	g      *evloop.Group
	gids   []uint64 // goroutine of each loop
	detach []func()
	once   sync.Once
}

func startLoops(t testing.TB, c *Client, n int) *loops {
	t.Helper()
	g, err := evloop.Start(evloop.Config{Loops: n})
	if err != nil {
		t.Fatal(err)
	}
	h := &loops{c: c, g: g, gids: make([]uint64, n), detach: make([]func(), n)}
	t.Cleanup(func() { h.stop(t) })
	for i, l := range g.Loops() {
		h.on(t, i, func() {
			h.gids[i] = testkit.GoroutineID()
			d, err := c.AttachLoop(l)
			if err != nil {
				t.Errorf("attach loop %d: %v", i, err)
			}
			h.detach[i] = d
		})
	}
	return h
}

// on runs fn on loop i and waits.
func (h *loops) on(t testing.TB, i int, fn func()) {
	t.Helper()
	ch := make(chan struct{})
	h.g.Loops()[i].Post(func() { fn(); close(ch) })
	select {
	case <-ch:
	case <-time.After(20 * time.Second):
		t.Fatalf("loop %d did not run a posted function", i)
	}
}

// stop detaches the client on every loop and closes the loops.
func (h *loops) stop(t testing.TB) {
	h.once.Do(func() {
		for i, d := range h.detach {
			if d != nil {
				h.on(t, i, d)
			}
		}
		h.g.Close()
	})
}

// loopDone is one Completer call.
type loopDone struct {
	gid    uint64
	onLoop bool
	cause  Cause
	err    error
}

// loopRec is a LoopCompleter recording every call.
type loopRec struct{ ch chan loopDone }

func newLoopRec(n int) *loopRec { return &loopRec{ch: make(chan loopDone, n)} }

func (r *loopRec) CheckDone(out *Decision, err error) {
	r.ch <- loopDone{gid: testkit.GoroutineID(), cause: out.Cause, err: err}
}

func (r *loopRec) CheckDoneOnLoop(out *Decision, err error) {
	r.ch <- loopDone{gid: testkit.GoroutineID(), onLoop: true, cause: out.Cause, err: err}
}

func (r *loopRec) next(t *testing.T) loopDone {
	t.Helper()
	select {
	case d := <-r.ch:
		return d
	case <-time.After(20 * time.Second):
		t.Fatal("no Completer call")
		return loopDone{}
	}
}

// none fails if a Completer call is queued.
func (r *loopRec) none(t *testing.T) {
	t.Helper()
	select {
	case d := <-r.ch:
		t.Fatalf("an extra Completer call: %+v", d)
	default:
	}
}

func readerGoroutines() int {
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	return bytes.Count(buf, []byte("udpshard.(*reader).run"))
}

// startLoopChecks starts n checks on loop i in one turn; with one loop
// (no other loop flushing meanwhile) the datagrams must still be queued
// when the turn's code returns.
func startLoopChecks(t *testing.T, h *loops, i, n int, rec *loopRec) {
	t.Helper()
	outs := make([]Decision, n)
	h.on(t, i, func() {
		sent := h.c.ring.Stats().Sent
		for k := range n {
			if _, decided, err := h.c.CheckAsyncLoop(i, testRequest(), &outs[k], rec); decided {
				t.Errorf("decided at once: %v", err)
			}
		}
		if got := h.c.ring.Stats().Sent; got != sent && len(h.gids) == 1 {
			t.Errorf("%d datagrams sent during the turn, want them queued for its end", got-sent)
		}
	})
}

// TestLoopChecksAnsweredOnTheirLoop: checks started on a loop go out on
// the loop's shard at its turn end, and a real rlserver's answers end
// them on the loop's goroutine (CheckDoneOnLoop), with no reader
// goroutine for the loop shards and no hand-off.
func TestLoopChecksAnsweredOnTheirLoop(t *testing.T) {
	cred := testCred()
	cl := rlcluster.Start(t, rlcluster.Config{Nodes: 2, SRV: testSRV, Credentials: []credentials.Credential{cred}})
	before := readerGoroutines()
	c := newTestClient(t, cl.DNS.Addr(), clientOpts{shards: 1, loops: 2})
	testkit.WaitFor(t, "the goroutine shard's reader", func() bool { return readerGoroutines()-before >= 1 })
	if got := readerGoroutines() - before; got != 1 {
		t.Fatalf("%d reader goroutines for 1 goroutine shard and 2 loop shards, want 1", got)
	}
	waitReady(t, c)
	h := startLoops(t, c, 2)
	rec := newLoopRec(32)
	for i := range 2 {
		startLoopChecks(t, h, i, 8, rec)
	}
	byLoop := map[uint64]int{}
	for range 16 {
		d := rec.next(t)
		if !d.onLoop || d.err != nil || !d.cause.Decided() {
			t.Fatalf("completion %+v, want decided on the loop", d)
		}
		byLoop[d.gid]++
	}
	if byLoop[h.gids[0]] != 8 || byLoop[h.gids[1]] != 8 {
		t.Fatalf("completions by goroutine %v, loops are %v", byLoop, h.gids)
	}
	st := c.Stats()
	if st.LoopDone != 16 || st.LoopHandoffs != 0 {
		t.Fatalf("loop completions %d, hand-offs %d; want 16, 0", st.LoopDone, st.LoopHandoffs)
	}
	rec.none(t)
}

// TestLoopShardBadDatagrams: garbage, forged and oversized datagrams on a
// loop's socket are dropped on the loop, and checks keep working.
func TestLoopShardBadDatagrams(t *testing.T) {
	n := startFakeNode(t, 1, testCred())
	d := dnstest.Start(t)
	d.SetSRV(testSRV, targetsFor(n.addr())...)
	c := newTestClient(t, d.Addr(), clientOpts{shards: 1, loops: 1})
	waitReady(t, c)
	h := startLoops(t, c, 1)
	conn, err := net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(c.ring.LocalAddr(0)))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	wrong, _ := wire.NewKey(wrongCred().KeyID, wrongCred().Secret)
	forged, err := wrong.Seal(nil, &wire.Header{Kind: wire.KindRateResponse, RequestID: 64, TTLms: c.ttlMs,
		Timestamp: uint64(time.Now().UnixMilli())}, &wire.RateResponse{Success: true})
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range [][]byte{{1, 2, 3}, forged, make([]byte, 4000), bytes.Repeat([]byte{0xff}, 200)} {
		if _, err := conn.Write(b); err != nil {
			t.Fatal(err)
		}
	}
	testkit.WaitFor(t, "bad datagrams counted", func() bool {
		s := c.Stats()
		return s.Drops.Malformed+s.Drops.Auth+s.Drops.Kind+s.Ring.Dropped.Truncated >= 4
	})
	rec := newLoopRec(1)
	startLoopChecks(t, h, 0, 1, rec)
	if got := rec.next(t); !got.onLoop || !got.cause.Decided() || got.gid != h.gids[0] {
		t.Fatalf("check after bad datagrams: %+v", got)
	}
}

// TestLoopShardRebindLateAnswer: a check in flight when its shard's
// socket is switched is still decided by an answer to the old socket,
// read by the loop.
func TestLoopShardRebindLateAnswer(t *testing.T) {
	n := startFakeNode(t, 1, testCred())
	n.set(func(n *fakeNode) { n.drop = true })
	d := dnstest.Start(t)
	d.SetSRV(testSRV, targetsFor(n.addr())...)
	c := newTestClient(t, d.Addr(), clientOpts{shards: 1, loops: 1, policy: ratelimitly.Standard(300 * time.Millisecond)})
	waitReady(t, c)
	h := startLoops(t, c, 1)
	old := c.ring.LocalAddr(0)
	rec := newLoopRec(1)
	startLoopChecks(t, h, 0, 1, rec)
	testkit.WaitFor(t, "the first send", func() bool { return n.count(wire.KindRateRequest) >= 1 })
	sock := c.ring.Hold(0)
	c.ring.Rebind(sock)
	sock.Release()
	testkit.WaitFor(t, "rebind", func() bool { return c.Stats().Ring.Rebinds == 1 })
	if c.ring.LocalAddr(0) == old {
		t.Fatal("the shard kept its socket")
	}
	n.set(func(n *fakeNode) { n.drop = false }) // the replay (on the old socket) is answered
	got := rec.next(t)
	if !got.onLoop || !got.cause.Decided() || got.gid != h.gids[0] {
		t.Fatalf("late answer on the old socket: %+v", got)
	}
	for _, s := range n.received() {
		if s.from != old {
			t.Fatalf("the check sent from %v, its socket was %v", s.from, old)
		}
	}
}

// TestLoopCheckNeverAnswered: a server that never answers: the loop's
// own deadline replays and then times the check out, exactly once, on
// the loop's goroutine (CheckDoneOnLoop, no hand-off), never before the
// policy's horizon.
func TestLoopCheckNeverAnswered(t *testing.T) {
	n := startFakeNode(t, 1, testCred())
	n.set(func(n *fakeNode) { n.drop = true })
	d := dnstest.Start(t)
	d.SetSRV(testSRV, targetsFor(n.addr())...)
	c := newTestClient(t, d.Addr(), clientOpts{shards: 1, loops: 1, policy: ratelimitly.Standard(50 * time.Millisecond)})
	waitReady(t, c)
	if _, wall := c.loops[0].tm.(*evTimer); !wall {
		t.Fatalf("loop timer %T with the wall clock, want the loop's own timer", c.loops[0].tm)
	}
	h := startLoops(t, c, 1)
	rec := newLoopRec(4)
	began := time.Now()
	startLoopChecks(t, h, 0, 1, rec)
	got := rec.next(t)
	took := time.Since(began)
	if !got.onLoop || got.gid != h.gids[0] || got.cause != CauseTimeout {
		t.Fatalf("unanswered check: %+v, want a timeout on the loop (goroutine %d)", got, h.gids[0])
	}
	if took < c.Horizon() {
		t.Fatalf("timed out after %v, before the horizon %v", took, c.Horizon())
	}
	if rs := n.received(); len(rs) != 2 || rs[1].attempt != 1 || !rs[1].replay {
		t.Fatalf("datagrams %+v, want the request and one replay", rs)
	}
	h.stop(t)
	c.Close()
	rec.none(t)
	if st := c.Stats(); st.LoopHandoffs != 0 || st.LoopDone != 1 || st.Replays != 1 {
		t.Fatalf("hand-offs %d, loop completions %d, replays %d; want 0, 1, 1", st.LoopHandoffs, st.LoopDone, st.Replays)
	}
}

// TestLoopsCloseWithChecksInFlight: the loops stop (detach, group
// closed) with checks in flight; Close ends each exactly once, and the
// test binary's leak check finds no goroutine or descriptor left.
func TestLoopsCloseWithChecksInFlight(t *testing.T) {
	n := startFakeNode(t, 1, testCred())
	n.set(func(n *fakeNode) { n.drop = true })
	d := dnstest.Start(t)
	d.SetSRV(testSRV, targetsFor(n.addr())...)
	c := newTestClient(t, d.Addr(), clientOpts{shards: 1, loops: 2})
	waitReady(t, c)
	h := startLoops(t, c, 2)
	rec := newLoopRec(20)
	startLoopChecks(t, h, 0, 10, rec)
	startLoopChecks(t, h, 1, 10, rec)
	testkit.WaitFor(t, "20 sends", func() bool { return n.count(wire.KindRateRequest) >= 20 })
	h.stop(t)
	c.Close()
	for range 20 {
		if got := rec.next(t); got.cause != CauseCancelled {
			t.Fatalf("in flight at close: %+v", got)
		}
	}
	rec.none(t)
}

// countingClock is the real clock, counting Now calls.
type countingClock struct {
	realClock
	n atomic.Int64
}

func (c *countingClock) Now() time.Time { c.n.Add(1); return time.Now() }

// TestLoopClockOncePerTurn: on an attached loop the client reads its
// clock once per turn for the turn's checks and answers, and again in the
// next turn; off the loop every call reads it.
func TestLoopClockOncePerTurn(t *testing.T) {
	d := dnstest.Start(t)
	d.SetSRV(testSRV, targetsFor(startFakeNode(t, 1, testCred()).addr())...)
	clk := &countingClock{}
	c := newTestClient(t, d.Addr(), clientOpts{shards: 1, loops: 1, clock: clk})
	waitReady(t, c)
	h := startLoops(t, c, 1)
	ls := c.loops[0]
	var first, second time.Time
	var reads int64
	h.on(t, 0, func() {
		n0 := clk.n.Load()
		first, second = c.nowOn(ls), c.nowOn(ls)
		reads = clk.n.Load() - n0
	})
	if reads != 1 || !first.Equal(second) {
		t.Fatalf("one turn: %d clock reads, times %v and %v; want 1 read, one time", reads, first, second)
	}
	h.on(t, 0, func() {
		n0 := clk.n.Load()
		c.nowOn(ls)
		reads = clk.n.Load() - n0
	})
	if reads != 1 {
		t.Fatalf("next turn: %d clock reads, want 1 (the previous turn's time is not reused)", reads)
	}
	n0 := clk.n.Load()
	c.nowOn(nil)
	c.nowOn(nil)
	if got := clk.n.Load() - n0; got != 2 {
		t.Fatalf("off the loop: %d clock reads for 2 calls", got)
	}
}

// TestLoopCheckStartIsFresh: a check started on a loop counts its round
// deadlines from a fresh clock read, not from a turn time read earlier in
// the same turn. The caller's own decision started between the two, so a
// stale start would end the check before the policy's horizon (CI saw a
// fail-open after 299.96 ms of 300).
func TestLoopCheckStartIsFresh(t *testing.T) {
	d, nodes := fakeCluster(t, 1)
	nodes[0].set(func(n *fakeNode) { n.drop = true })
	clk := newManualClock(time.Now())
	c := newTestClient(t, d.Addr(), clientOpts{shards: 1, loops: 1, clock: clk})
	waitReady(t, c)
	h := startLoops(t, c, 1)
	ls := c.loops[0]
	const id = 0x5a5a << 32
	testRequestID = func() uint64 { return id }
	t.Cleanup(func() { testRequestID = nil })
	rec := newLoopRec(2)
	var out Decision
	var turn, start time.Time
	h.on(t, 0, func() {
		turn = c.nowOn(ls) // an answer read early in the turn
		clk.Advance(40 * time.Millisecond)
		if _, decided, err := c.CheckAsyncLoop(0, testRequest(), &out, rec); decided {
			t.Errorf("decided at once: %v", err)
		}
		r := c.table.get(id)
		if r == nil {
			t.Error("the check is not in the table")
			return
		}
		r.mu.Lock()
		start = r.start
		r.mu.Unlock()
		if got := c.nowOn(ls); !got.Equal(start) {
			t.Errorf("turn time after the check %v, want the check's start %v", got, start)
		}
	})
	if want := turn.Add(40 * time.Millisecond); !start.Equal(want) {
		t.Fatalf("check start %v, want the clock at the check (%v), not the turn's earlier time %v", start, want, turn)
	}
}
