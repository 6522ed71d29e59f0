package rlclient

import (
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rl-tproxy/rl-tproxy/internal/testkit"
	"github.com/rl-tproxy/rl-tproxy/pkg/ratelimitly"
	"github.com/rl-tproxy/rl-tproxy/pkg/ratelimitly/wire"
)

// asyncDone is one CheckDone call.
type asyncDone struct {
	out   *Decision
	cause Cause
	err   error
}

// recorder is a Completer that counts its calls per Decision, so that a
// second completion of the same check is seen.
type recorder struct {
	mu    sync.Mutex
	calls map[*Decision]int
	ch    chan asyncDone
}

func newRecorder(n int) *recorder {
	return &recorder{calls: map[*Decision]int{}, ch: make(chan asyncDone, n)}
}

func (rc *recorder) CheckDone(out *Decision, err error) {
	rc.mu.Lock()
	rc.calls[out]++
	rc.mu.Unlock()
	rc.ch <- asyncDone{out, out.Cause, err}
}

func (rc *recorder) next(t testing.TB) asyncDone {
	t.Helper()
	select {
	case d := <-rc.ch:
		return d
	case <-time.After(20 * time.Second):
		t.Fatal("no completion")
		return asyncDone{}
	}
}

// once fails unless every Decision in outs completed exactly once.
func (rc *recorder) once(t testing.TB, outs []*Decision) {
	t.Helper()
	rc.mu.Lock()
	defer rc.mu.Unlock()
	for i, o := range outs {
		if n := rc.calls[o]; n != 1 {
			t.Errorf("check %d completed %d times", i, n)
		}
	}
}

func TestCheckAsyncAnswers(t *testing.T) {
	d, nodes := fakeCluster(t, 2)
	c := newTestClient(t, d.Addr(), clientOpts{})
	waitReady(t, c)
	rc := newRecorder(1)
	var outs []*Decision
	for i := 0; i < 20; i++ {
		if i == 10 {
			for _, n := range nodes {
				n.set(func(n *fakeNode) { n.deny = true })
			}
		}
		out := new(Decision)
		outs = append(outs, out)
		_, decided, err := c.CheckAsync(testRequest(), out, rc)
		if decided {
			t.Fatalf("check %d decided at once: %v %v", i, err, out.Cause)
		}
		got := rc.next(t)
		if got.out != out {
			t.Fatalf("check %d: completion for another Decision", i)
		}
		switch {
		case i < 10 && (got.err != nil || got.cause != CauseAllow || !out.Allow || len(out.Guards) != 1 || len(out.Resources) != 1):
			t.Fatalf("check %d: err %v decision %+v", i, got.err, out)
		case i >= 10 && (got.err != nil || !got.cause.Denied() || out.Allow):
			t.Fatalf("check %d: err %v decision %+v", i, got.err, out)
		}
	}
	rc.once(t, outs)
	if st := c.Stats(); st.InFlight != 0 || st.Checks != 20 || st.Causes[CauseAllow] != 10 {
		t.Errorf("stats: in flight %d checks %d causes %v", st.InFlight, st.Checks, st.Causes)
	}
}

func TestCheckAsyncHorizon(t *testing.T) {
	d, nodes := fakeCluster(t, 2)
	for _, n := range nodes {
		n.set(func(n *fakeNode) { n.drop = true })
	}
	clk := newManualClock(time.Now())
	u := 20 * time.Millisecond
	c := newTestClient(t, d.Addr(), clientOpts{clock: clk, policy: ratelimitly.Standard(u)})
	waitReady(t, c)
	rc := newRecorder(1)
	var out Decision
	if _, decided, err := c.CheckAsync(testRequest(), &out, rc); decided {
		t.Fatalf("decided at once: %v", err)
	}
	testkit.WaitFor(t, "first round", func() bool { return allCount(nodes, wire.KindRateRequest) == 2 })
	clk.Advance(u)
	testkit.WaitFor(t, "replay round", func() bool { return allCount(nodes, wire.KindRateRequest) == 4 })
	clk.Advance(u)
	if len(rc.ch) != 0 {
		t.Fatal("completed before the horizon")
	}
	clk.Advance(u)
	got := rc.next(t)
	if got.err != ErrTimeout || got.cause != CauseTimeout || out.Attempts != 2 {
		t.Fatalf("horizon: err %v decision %+v", got.err, out)
	}
	rc.once(t, []*Decision{&out})
}

func TestCheckAsyncAbort(t *testing.T) {
	d, nodes := fakeCluster(t, 2)
	for _, n := range nodes {
		n.set(func(n *fakeNode) { n.drop = true })
	}
	clk := newManualClock(time.Now())
	c := newTestClient(t, d.Addr(), clientOpts{clock: clk})
	waitReady(t, c)
	rc := newRecorder(4)
	var out Decision
	p, decided, _ := c.CheckAsync(testRequest(), &out, rc)
	if decided {
		t.Fatal("decided at once")
	}
	testkit.WaitFor(t, "sent", func() bool { return allCount(nodes, wire.KindRateRequest) == 2 })
	c.Abort(p)
	// Completed from inside Abort, retired with nothing left behind.
	if len(rc.ch) != 1 {
		t.Fatalf("%d completions right after Abort, want 1", len(rc.ch))
	}
	if got := rc.next(t); got.err != ErrCancelled || got.cause != CauseCancelled {
		t.Fatalf("aborted: err %v cause %v", got.err, got.cause)
	}
	for _, es := range c.shards {
		es.mu.Lock()
		n := len(es.heap)
		es.mu.Unlock()
		if n != 0 {
			t.Errorf("shard %d still holds %d deadlines", es.idx, n)
		}
	}
	if c.table.get(nodes[0].received()[0].id) != nil {
		t.Error("aborted request still in the table")
	}
	c.Abort(p)         // twice: nothing
	c.Abort(Pending{}) // none: nothing
	// A stale Pending does not abort the check that reuses its state.
	var out2 Decision
	p2, decided, _ := c.CheckAsync(testRequest(), &out2, rc)
	if decided {
		t.Fatal("second check decided at once")
	}
	if p2.r == p.r && p2.gen == p.gen {
		t.Fatal("reused state kept its generation")
	}
	c.Abort(p)
	if len(rc.ch) != 0 {
		t.Fatal("a stale Pending aborted a later check")
	}
	c.Abort(p2)
	if got := rc.next(t); got.out != &out2 || got.cause != CauseCancelled {
		t.Fatalf("second abort: %+v", got)
	}
	// Abort after a decision: the decision stands, no second completion.
	for _, n := range nodes {
		n.set(func(n *fakeNode) { n.drop = false })
	}
	var out3 Decision
	p3, _, _ := c.CheckAsync(testRequest(), &out3, rc)
	if got := rc.next(t); got.err != nil || got.cause != CauseAllow {
		t.Fatalf("answered: err %v cause %v", got.err, got.cause)
	}
	c.Abort(p3)
	if len(rc.ch) != 0 || out3.Cause != CauseAllow {
		t.Fatalf("abort after the decision changed it: %d completions, cause %v", len(rc.ch), out3.Cause)
	}
	rc.once(t, []*Decision{&out, &out2, &out3})
	if st := c.Stats(); st.InFlight != 0 {
		t.Errorf("in flight %d", st.InFlight)
	}
}

func TestCheckAsyncDecidedAtOnce(t *testing.T) {
	d, _ := fakeCluster(t, 1)
	c := newTestClient(t, d.Addr(), clientOpts{})
	waitReady(t, c)
	rc := newRecorder(1)
	var out Decision
	req := testRequest()
	req.Label = []byte(strings.Repeat("x", wire.MaxLabel+1))
	p, decided, err := c.CheckAsync(req, &out, rc)
	if !decided || err != ErrConstruction || out.Cause != CauseConstruction || p != (Pending{}) {
		t.Fatalf("long label: decided %v err %v decision %+v", decided, err, out)
	}
	c.Close()
	p, decided, err = c.CheckAsync(testRequest(), &out, rc)
	if !decided || err != ErrClosed || out.Cause != CauseNoEndpoints || p != (Pending{}) {
		t.Fatalf("closed: decided %v err %v decision %+v", decided, err, out)
	}
	if len(rc.ch) != 0 {
		t.Fatal("a check decided at once also completed")
	}
}

func TestCheckAsyncCloseInFlight(t *testing.T) {
	d, nodes := fakeCluster(t, 2)
	for _, n := range nodes {
		n.set(func(n *fakeNode) { n.drop = true })
	}
	clk := newManualClock(time.Now())
	c := newTestClient(t, d.Addr(), clientOpts{clock: clk})
	waitReady(t, c)
	const n = 64
	rc := newRecorder(n)
	outs := make([]*Decision, n)
	for i := range outs {
		outs[i] = new(Decision)
		if _, decided, err := c.CheckAsync(testRequest(), outs[i], rc); decided {
			t.Fatalf("check %d decided at once: %v", i, err)
		}
	}
	testkit.WaitFor(t, "sent", func() bool { return allCount(nodes, wire.KindRateRequest) == 2*n })
	c.Close()
	// Every completion was delivered before Close returned.
	if len(rc.ch) != n {
		t.Fatalf("%d completions after Close, want %d", len(rc.ch), n)
	}
	for range n {
		if got := rc.next(t); got.err != ErrCancelled || got.cause != CauseCancelled {
			t.Fatalf("in flight at close: err %v cause %v", got.err, got.cause)
		}
	}
	rc.once(t, outs)
}

// TestCheckAsyncConcurrentAbortAndClose races answers, Aborts and Close
// against each other: every check ends exactly once, either decided at
// once or through its Completer.
func TestCheckAsyncConcurrentAbortAndClose(t *testing.T) {
	d, nodes := fakeCluster(t, 3)
	nodes[2].set(func(n *fakeNode) { n.drop = true }) // some checks wait for a round end
	c := newTestClient(t, d.Addr(), clientOpts{policy: ratelimitly.Standard(5 * time.Millisecond)})
	waitReady(t, c)
	const workers, per = 4, 300
	rc := newRecorder(workers * per)
	var atOnce atomic.Int64
	var wg sync.WaitGroup
	outs := make([][]*Decision, workers)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range per {
				out := new(Decision)
				p, decided, _ := c.CheckAsync(testRequest(), out, rc)
				if decided {
					atOnce.Add(1)
					continue
				}
				outs[w] = append(outs[w], out)
				if i%3 == 0 {
					c.Abort(p)
				}
				if w == 0 && i == per/2 {
					c.Close()
				}
			}
		}()
	}
	wg.Wait()
	pending := 0
	for _, o := range outs {
		pending += len(o)
	}
	if pending+int(atOnce.Load()) != workers*per {
		t.Fatalf("%d pending + %d at once != %d", pending, atOnce.Load(), workers*per)
	}
	for range pending {
		rc.next(t)
	}
	for _, o := range outs {
		rc.once(t, o)
	}
	if len(rc.ch) != 0 {
		t.Errorf("%d extra completions", len(rc.ch))
	}
	if st := c.Stats(); st.InFlight != 0 {
		t.Errorf("in flight %d", st.InFlight)
	}
}
