package hook

import (
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rl-tproxy/rl-tproxy/internal/testkit"
	"github.com/rl-tproxy/rl-tproxy/pkg/evloop"
	"github.com/rl-tproxy/rl-tproxy/pkg/exchange"
	"github.com/rl-tproxy/rl-tproxy/pkg/ratelimitly"
)

// loopConn is what the loop path keeps per connection for admission: the
// Request and Decision it owns, and a Resumer that hands the request back
// to its loop (Post, from any goroutine). Everything after Resume runs on
// the loop thread.
type loopConn struct {
	g       *Gate
	r       *exchange.Request
	d       exchange.Decision
	resumed func() // c.onLoop, made once
	out     chan loopResult
}

type loopResult struct {
	d     exchange.Decision
	cause ratelimitly.Cause
}

func (c *loopConn) Resume() { c.r.Loop.Post(c.resumed) }

// onLoop runs on the loop thread after Resume: the proxy would answer or
// forward now; here Done ends the request.
func (c *loopConn) onLoop() {
	res := loopResult{d: c.d}
	if st, ok := c.d.State.(*state); ok {
		res.cause = st.dec.Cause
	}
	c.g.Done(c.r, &c.d, &exchange.Result{Status: 200, End: time.Now()})
	c.out <- res
}

// begin starts c's admission on the loop thread.
func (c *loopConn) begin() {
	if c.g.Begin(c.r, &c.d, c) {
		c.onLoop()
	}
}

func newLoopConn(g *Gate, r *exchange.Request, l *evloop.Loop) *loopConn {
	r.Loop = l
	c := &loopConn{g: g, r: r, out: make(chan loopResult, 1)}
	c.resumed = c.onLoop
	return c
}

func (c *loopConn) wait(t *testing.T) loopResult {
	t.Helper()
	select {
	case res := <-c.out:
		return res
	case <-time.After(20 * time.Second):
		t.Fatal("admission never came back to the loop")
		return loopResult{}
	}
}

func startLoop(t *testing.T) *evloop.Loop {
	t.Helper()
	grp, err := evloop.Start(evloop.Config{Loops: 1, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { grp.Close() })
	return grp.Loops()[0]
}

// The Gate on a real event loop: Begin runs on the loop thread and
// returns without waiting for RateLimitly, the answer comes back through
// Resume and Post, and Cancel from the loop thread resumes the request
// (from inside Cancel) with the client-gone decision.
func TestBeginOnEventLoop(t *testing.T) {
	l := startLoop(t)
	t.Run("embedded", func(t *testing.T) {
		g, r := embeddedGate(t, "1/m")
		c := newLoopConn(g, r, l)
		for i, want := range []bool{true, false} {
			r.Start = time.Now()
			l.Post(c.begin)
			if res := c.wait(t); res.d.Allow != want {
				t.Fatalf("request %d: allow %v status %d", i, res.d.Allow, res.d.Status)
			}
		}
	})
	t.Run("cancel", func(t *testing.T) {
		g, r, cl := silentGate(t, "open", 2*time.Second)
		c := newLoopConn(g, r, l)
		l.Post(c.begin)
		testkit.WaitFor(t, "check in flight", func() bool { return cl.Stats().InFlight == 1 })
		l.Post(func() { g.Cancel(r) })
		res := c.wait(t)
		if res.d.Allow || res.d.Status != statusClientClosed || res.cause != ratelimitly.CauseCancelled {
			t.Fatalf("cancelled: allow %v status %d cause %v", res.d.Allow, res.d.Status, res.cause)
		}
	})
	t.Run("horizon", func(t *testing.T) {
		g, r, _ := silentGate(t, "close", 5*time.Millisecond)
		c := newLoopConn(g, r, l)
		l.Post(c.begin)
		res := c.wait(t)
		if res.d.Allow || res.d.Status != 429 || res.cause != ratelimitly.CauseTimeout {
			t.Fatalf("horizon: allow %v status %d cause %v", res.d.Allow, res.d.Status, res.cause)
		}
	})
}

// onLoopConn is a loopConn whose Resumer is also a proxy.LoopResumer (as
// the proxy's is), counting how each admission came back.
type onLoopConn struct {
	*loopConn
	posts, inline atomic.Int64
	inlineG       atomic.Uint64 // goroutine of the last ResumeOnLoop
}

func (c *onLoopConn) Resume() {
	c.posts.Add(1)
	c.loopConn.Resume()
}

func (c *onLoopConn) ResumeOnLoop() {
	c.inline.Add(1)
	c.inlineG.Store(testkit.GoroutineID())
	c.onLoop()
}

func (c *onLoopConn) begin() {
	if c.g.Begin(c.r, &c.d, c) {
		c.onLoop()
	}
}

// With the client attached to the loop, Begin's check goes out on the
// loop's shard and its answer (from the embedded rlserver) resumes the
// request on the loop goroutine inline: no Post, no hand-off.
func TestBeginOnLoopShard(t *testing.T) {
	grp, err := evloop.Start(evloop.Config{Loops: 1, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	l := grp.Loops()[0]
	g, r, cl := embeddedGateLoops(t, "2/m", 1)
	var loopG uint64
	var detach func()
	attached := make(chan error, 1)
	l.Post(func() {
		loopG = testkit.GoroutineID()
		var err error
		detach, err = cl.AttachLoop(l)
		attached <- err
	})
	if err := <-attached; err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		done := make(chan struct{})
		l.Post(func() { detach(); close(done) })
		<-done
		grp.Close()
	})
	c := &onLoopConn{loopConn: newLoopConn(g, r, l)}
	for i, want := range []bool{true, true, false} {
		r.Start = time.Now()
		l.Post(c.begin)
		if res := c.wait(t); res.d.Allow != want {
			t.Fatalf("request %d: allow %v status %d", i, res.d.Allow, res.d.Status)
		}
	}
	if c.posts.Load() != 0 || c.inline.Load() != 3 || c.inlineG.Load() != loopG {
		t.Fatalf("resumed by Post %d times, inline %d times on goroutine %d (loop %d); want 0, 3 on the loop",
			c.posts.Load(), c.inline.Load(), c.inlineG.Load(), loopG)
	}
	if st := cl.Stats(); st.LoopDone != 3 || st.LoopHandoffs != 0 {
		t.Fatalf("client: %d loop completions, %d hand-offs; want 3, 0", st.LoopDone, st.LoopHandoffs)
	}
}
