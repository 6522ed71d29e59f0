package hook

import (
	"context"
	"sync"

	"github.com/rl-tproxy/rl-tproxy/pkg/admission"
	"github.com/rl-tproxy/rl-tproxy/pkg/exchange"
	"github.com/rl-tproxy/rl-tproxy/pkg/proxy"
	"github.com/rl-tproxy/rl-tproxy/pkg/ratelimitly"
	"github.com/rl-tproxy/rl-tproxy/pkg/ratelimitly/wire"
	"github.com/rl-tproxy/rl-tproxy/pkg/rlclient"
)

// The Gate is an AsyncHook: the event-loop path admits through Begin.
var _ proxy.AsyncHook = (*Gate)(nil)

// Begin implements proxy.AsyncHook. It decides at once everything that
// needs no RateLimitly answer (no policy, no location, an unprotected
// location, a value that cannot be rendered, no checker); a protected
// request's check goes out through the checker without blocking (the
// rlclient Client's CheckAsyncLoop with r.Loop's ID: on a loop the
// client is attached to, the loop's own shard; any other checker runs on
// a goroutine) and its end fills *d and resumes the proxy: inline
// (proxy.LoopResumer) when the answer was read on r.Loop, else through
// Resume. The decision, its metrics,
// access fields and reports in Done are those of Admit.
func (g *Gate) Begin(r *exchange.Request, d *exchange.Decision, res proxy.Resumer) bool {
	st, svc := g.prepare(r)
	if st.gen == nil {
		*d = st.unmatched()
		return true
	}
	g.inflight.Inc()
	st.tk.loop = -1
	if r.Loop != nil {
		st.tk.loop = r.Loop.ID() // the check goes out on the loop's own shard
	}
	if g.eng.Begin(st.gen.pol, svc, &st.areq, &st.dec) {
		g.inflight.Dec()
		*d = g.decision(st)
		return true
	}
	st.r, st.pd, st.res = r, d, res
	st.phase.Store(pendRunning)
	g.pending.Add(1)
	r.HookState = st
	if !st.tk.start(st.ref.c, &st.dec.Req, &st.dec.Result) {
		return false // st belongs to the check now: checked resumes the proxy
	}
	g.unpend(st)
	st.r, st.pd, st.res = nil, nil, nil
	g.eng.End(st.gen.pol, &st.dec, false)
	g.inflight.Dec()
	*d = g.decision(st)
	return true
}

// Cancel implements proxy.AsyncHook: the client of r went away while its
// check runs. The check is aborted (an rlclient check ends at once with
// CauseCancelled, a blocking checker's context is cancelled) and the
// request ends as Admit's would with a cancelled context; the proxy is
// resumed as usual, possibly from inside Cancel.
func (g *Gate) Cancel(r *exchange.Request) {
	st, _ := r.HookState.(*state)
	// Only a running check is cancelled: one that ended (unpend) before
	// this Cancel is left alone. st cannot be reused meanwhile: that
	// needs Done, which the proxy calls only after Resume has been
	// handled on its thread.
	if st != nil && st.phase.CompareAndSwap(pendRunning, pendCancelled) {
		st.tk.abort(st.ref.c)
	}
}

// Phases of an asynchronous admission (state.phase).
const (
	pendNone int32 = iota
	pendRunning
	pendCancelled
)

// unpend ends st's pending phase and reports whether Cancel came first.
func (g *Gate) unpend(st *state) bool {
	g.pending.Add(-1)
	return st.phase.Swap(pendNone) == pendCancelled
}

// checked ends a request whose check ended after Begin returned false:
// it finishes the decision, fills the proxy's Decision and resumes it.
func (st *state) checked() { st.checkedOn(false) }

// checkedOn is checked; onLoop: on the request's loop thread outside the
// proxy's calls (rlclient's CheckDoneOnLoop), where the proxy continues
// the request inline instead of through Post.
func (st *state) checkedOn(onLoop bool) {
	g := st.g
	cancelled := g.unpend(st)
	g.eng.End(st.gen.pol, &st.dec, cancelled)
	g.inflight.Dec()
	d, res := st.pd, st.res
	st.r, st.pd, st.res = nil, nil, nil
	*d = g.decision(st)
	// st and d are the proxy's from here on
	if lr, ok := res.(proxy.LoopResumer); ok && onLoop {
		lr.ResumeOnLoop()
		return
	}
	res.Resume()
}

// asyncChecker is a checker that can check without blocking: Client
// (through rlclient's CheckAsync) and noChecker. Other checkers run their
// blocking Check on a goroutine.
type asyncChecker interface {
	// checkAsync starts the check of req into out. It returns true when
	// out is filled at once; otherwise t.checked is called exactly once
	// later, from any goroutine.
	checkAsync(req *wire.RateRequest, out *admission.CheckResult, t *ticket) bool
	// abortCheck ends t's check early if it still runs.
	abortCheck(t *ticket)
}

// ticket is one check started by Begin: it carries the checker's
// per-check state and hands the end back to the request (st.checked).
type ticket struct {
	st   *state
	loop int // ID of the event loop Begin ran on, -1 for none

	mu      sync.Mutex
	pending rlclient.Pending // Client: the running check
	out     *admission.CheckResult
	cancel  context.CancelFunc // a blocking checker: cancels its context
	d       rlclient.Decision  // Client: the answer
}

// start starts the check with c; see asyncChecker.checkAsync.
func (t *ticket) start(c admission.Checker, req *wire.RateRequest, out *admission.CheckResult) bool {
	if ac, ok := c.(asyncChecker); ok {
		return ac.checkAsync(req, out, t)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.mu.Lock()
	t.cancel = cancel
	t.mu.Unlock()
	go func() {
		c.Check(ctx, req, out)
		t.mu.Lock()
		t.cancel = nil
		t.mu.Unlock()
		cancel()
		t.st.checked()
	}()
	return false
}

// abort ends t's check early if it still runs.
func (t *ticket) abort(c admission.Checker) {
	if ac, ok := c.(asyncChecker); ok {
		ac.abortCheck(t)
		return
	}
	t.mu.Lock()
	cancel := t.cancel
	t.mu.Unlock()
	if cancel != nil {
		cancel()
	}
}

// checkAsync implements asyncChecker with rlclient's CheckAsync.
func (a *Client) checkAsync(req *wire.RateRequest, out *admission.CheckResult, t *ticket) bool {
	t.mu.Lock() // CheckDone waits for pending to be stored
	p, decided, err := a.C.CheckAsyncLoop(t.loop, req, &t.d, t)
	if decided {
		t.mu.Unlock()
		fillResult(&t.d, err, out)
		return true
	}
	t.pending, t.out = p, out
	t.mu.Unlock()
	return false
}

// abortCheck implements asyncChecker.
func (a *Client) abortCheck(t *ticket) {
	t.mu.Lock()
	p := t.pending
	t.mu.Unlock()
	a.C.Abort(p) // a check that already ended is left alone
}

// CheckDone implements rlclient.Completer for Client.checkAsync.
func (t *ticket) CheckDone(d *rlclient.Decision, err error) { t.done(d, err, false) }

// CheckDoneOnLoop implements rlclient.LoopCompleter: the answer was read
// on the loop that started the check, so the proxy resumes inline.
func (t *ticket) CheckDoneOnLoop(d *rlclient.Decision, err error) { t.done(d, err, true) }

func (t *ticket) done(d *rlclient.Decision, err error, onLoop bool) {
	t.mu.Lock()
	out := t.out
	t.pending, t.out = rlclient.Pending{}, nil
	t.mu.Unlock()
	fillResult(d, err, out)
	t.st.checkedOn(onLoop)
}

// checkAsync implements asyncChecker: no checker, no endpoints.
func (noChecker) checkAsync(_ *wire.RateRequest, out *admission.CheckResult, _ *ticket) bool {
	out.Valid, out.Fail = false, ratelimitly.CauseNoEndpoints
	return true
}

func (noChecker) abortCheck(*ticket) {}
