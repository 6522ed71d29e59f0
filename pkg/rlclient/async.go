package rlclient

import (
	"sync"

	"github.com/rl-tproxy/rl-tproxy/pkg/ratelimitly/wire"
)

// Completer receives the outcome of a check that CheckAsync left pending.
// It is an interface, not a func, so that a caller passes a pointer it
// already owns (its per-request state) and no closure is allocated per
// check.
type Completer interface {
	// CheckDone is called exactly once per pending check, with out (the
	// Decision given to CheckAsync) filled and the error Check would have
	// returned. It runs on the client's receive or timer goroutine, on
	// the event loop that reads the shard (CheckAsyncLoop; see
	// LoopCompleter), or inside Abort or Close, with no lock of the check
	// held; it must not block.
	CheckDone(out *Decision, err error)
}

// Pending names a check that CheckAsync left pending, for Abort. The zero
// Pending names none. It stays harmless after the check completed: an
// Abort with it then does nothing.
type Pending struct {
	r   *request
	gen uint64
}

// CheckAsync starts one rate check and never blocks: it runs the same
// algorithm as Check (every usable endpoint, rounds and replays up to the
// horizon, completions, health, causes). When the outcome is known at
// once (client closed, no endpoints, a request that cannot be built, no
// datagram could be queued) it fills out and returns decided = true with
// the error Check would return, and done is never called. Otherwise it
// returns decided = false and done.CheckDone(out, err) is called exactly
// once later, possibly before CheckAsync has returned (from another
// goroutine); out must stay valid and untouched until then. req is only
// read during the call.
//
// CheckAsync never waits for RateLimitly. Like Check it may send the
// check's datagrams from the calling goroutine (at low load, or with a
// full shard queue: see udpshard Flush and FlushAsync); only when the
// socket's send buffer is full does that send wait, in the netpoller,
// until the socket takes it.
func (c *Client) CheckAsync(req *wire.RateRequest, out *Decision, done Completer) (p Pending, decided bool, err error) {
	return c.checkAsync(nil, req, out, done)
}

// checkAsync is CheckAsync; ls is the loop shard of a check started on
// its loop (CheckAsyncLoop), nil otherwise.
func (c *Client) checkAsync(ls *loopShard, req *wire.RateRequest, out *Decision, done Completer) (p Pending, decided bool, err error) {
	out.Reset()
	c.c.checks.Add(1)
	if c.closed.Load() {
		return Pending{}, true, c.finishEarly(out, CauseNoEndpoints, ErrClosed)
	}
	mem := c.disc.current()
	if mem == nil || len(mem.eps) == 0 {
		return Pending{}, true, c.finishEarly(out, CauseNoEndpoints, nil)
	}
	r := c.pool.get(c)
	r.mu.Lock() // stale readers from r's previous life may still look at it
	if !c.start(r, ls, mem, req, out) {
		return Pending{}, true, causeErr[out.Cause]
	}
	if r.fire { // ended while starting: the caller gets the outcome now
		r.fire = false
		closed := r.cause == CauseCancelled
		shard := r.sock.Shard()
		r.mu.Unlock()
		if !closed {
			c.flushFrom(ls, shard)
		}
		return Pending{}, true, c.finish(r, out)
	}
	r.out, r.comp = out, done
	p = Pending{r: r, gen: r.gen}
	shard := r.sock.Shard()
	r.mu.Unlock()
	c.flushFrom(ls, shard) // after unlocking: datagrams were only queued under r.mu
	return p, false, nil
}

// Abort ends the pending check p at once with CauseCancelled (nothing is
// left behind: no deadline, no table entry), unless it has already been
// decided or failed: that outcome then stands. Either way its Completer
// is called exactly once: from inside Abort when Abort ended it,
// otherwise by whoever ended it. Abort of a completed check does nothing.
func (c *Client) Abort(p Pending) {
	r := p.r
	if r == nil {
		return
	}
	r.mu.Lock()
	if r.gen != p.gen || r.state != statePending {
		r.mu.Unlock()
		return
	}
	r.finishLocked(CauseCancelled)
	r.unlock()
}

// unlock releases r.mu. When the request ended while it was held
// (finishLocked), it then delivers the outcome: r goes back to the pool
// and its Completer is called, with no lock held.
func (r *request) unlock() {
	if !r.fire {
		r.mu.Unlock()
		return
	}
	c := r.c
	r.fire = false
	out, comp := r.out, r.comp
	r.out, r.comp = nil, nil
	if r.ls != nil {
		c.c.loopHandoffs.Add(1) // a loop's check ended on another thread (or in Abort)
	}
	r.mu.Unlock()
	err := c.finish(r, out)
	comp.CheckDone(out, err)
}

// waiter is Check's Completer: it hands the outcome to the goroutine
// waiting in Check.
type waiter struct {
	ch  chan struct{}
	err error
}

func (w *waiter) CheckDone(_ *Decision, err error) {
	w.err = err
	w.ch <- struct{}{}
}

// waiterPool recycles Check's waiters: a plain free list, like reqPool,
// because a sync.Pool is emptied by the GC and Check would then allocate
// in steady state. It keeps at most maxFreeWaiters: a burst of Checks
// beyond that leaves its extra waiters to the GC.
type waiterPool struct {
	mu   sync.Mutex
	free []*waiter
}

const maxFreeWaiters = 4096

var waiters waiterPool

func (p *waiterPool) get() *waiter {
	p.mu.Lock()
	if n := len(p.free); n > 0 {
		w := p.free[n-1]
		p.free[n-1] = nil
		p.free = p.free[:n-1]
		p.mu.Unlock()
		return w
	}
	p.mu.Unlock()
	return &waiter{ch: make(chan struct{}, 1)}
}

func (p *waiterPool) put(w *waiter) {
	w.err = nil
	p.mu.Lock()
	if len(p.free) < maxFreeWaiters {
		p.free = append(p.free, w)
	}
	p.mu.Unlock()
}
