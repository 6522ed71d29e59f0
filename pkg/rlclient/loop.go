package rlclient

import (
	"fmt"
	"net/netip"
	"time"

	"github.com/rl-tproxy/rl-tproxy/pkg/evloop"
	"github.com/rl-tproxy/rl-tproxy/pkg/ratelimitly/wire"
	"github.com/rl-tproxy/rl-tproxy/pkg/udpshard"
)

// A LoopCompleter is a Completer that can also take the outcome on the
// event loop that started the check (CheckAsyncLoop). CheckDoneOnLoop is
// called instead of CheckDone when the answer that ended the check was
// read on that loop's thread: after the loop's read of its shard's
// sockets (outside every lock of the client and of udpshard, and outside
// any handler of the caller), so it may continue the caller's work
// inline. A round deadline of such a check runs on the loop too (its
// loop timer, see loopdl.go), and a check it ends also gets
// CheckDoneOnLoop. Checks that end elsewhere (Abort, Close, Drain, or a
// deadline after the loop detached) still get CheckDone.
type LoopCompleter interface {
	Completer
	CheckDoneOnLoop(out *Decision, err error)
}

// loopShard is the client's side of one event loop: shard idx (the
// loop's ID) is owned by the loop while attached. Every field but c and
// idx is the loop thread's.
type loopShard struct {
	c        *Client
	idx      int
	l        *evloop.Loop
	attached bool
	unturn   func()      // removes turnEnd from l's turn-end list (while attached)
	dirty    bool        // datagrams queued on the shard this turn: flush at turn end
	ready    []readyDone // checks ended by this turn's reads, for their Completers
	handler  udpshard.Handler
	now      time.Time // the client clock, read once per turn (nowOn)
	nowSet   bool
	dl       loopDeadlines // round deadlines of the loop's checks (loopdl.go)
	armed    time.Time     // the deadline tm is armed for (zero: none)
	tm       loopTimer
	fire     func() // onDeadline, made once
	// blocked: the shard's socket had a full send buffer at the last
	// flush, datagrams wait in its queue; retry (backoff) wakes an idle
	// loop to flush them again.
	blocked bool
	retry   evloop.Timer
	backoff time.Duration
	retried bool // the retry timer fired this turn
}

// readyDone is a check's outcome awaiting its Completer on the loop.
type readyDone struct {
	comp Completer
	out  *Decision
	err  error
}

func newLoopShard(c *Client, idx int) *loopShard {
	ls := &loopShard{c: c, idx: idx, ready: make([]readyDone, 0, 64)}
	ls.handler = func(rx *udpshard.Socket, pkt []byte, from netip.AddrPort) { c.receive(rx, pkt, from, ls) }
	ls.fire = ls.onDeadline
	ls.dl.fifo = make([]loopEntry, 0, 256)
	ls.tm = newLoopTimer(ls)
	return ls
}

// AttachLoop implements pkg/proxy's LoopAttacher: on l's thread, the
// shard whose index is l's ID becomes l's (udpshard owned mode): its
// sockets are read by l, the answers end their checks there, and the
// datagrams the checks of a turn queued go out at the end of the turn,
// together. It fails when the client has no shard for l (Config.LoopShards
// must be the number of loops). detach gives the shard back (l's thread).
func (c *Client) AttachLoop(l *evloop.Loop) (detach func(), err error) {
	id := l.ID()
	if id < 0 || id >= len(c.loops) {
		return nil, fmt.Errorf("rlclient: no shard for event loop %d (LoopShards %d: one per loop)", id, len(c.loops))
	}
	if c.closed.Load() {
		return nil, nil // a client replaced before the loops started: nothing to attach
	}
	ls := c.loops[id]
	if ls.attached {
		return nil, fmt.Errorf("rlclient: shard %d is attached already", id)
	}
	ls.l = l
	ls.tm.attach(l)
	ls.retry.Init(l, ls.retrySend)
	release, err := c.ring.Own(id, loopOwner{ls}, ls.handler)
	if err != nil {
		return nil, fmt.Errorf("rlclient: %w", err)
	}
	ls.attached = true
	ls.unturn = l.OnTurnEnd(ls.turnEnd)
	ls.runReady() // answers read while watching the sockets
	return func() {
		ls.turnEnd()
		ls.attached = false
		ls.migrate() // the checks in flight keep their deadlines, on the timer goroutine
		ls.retry.Stop()
		blocked := ls.blocked
		ls.blocked, ls.backoff, ls.retried = false, 0, false
		release()
		if blocked {
			// Datagrams wait behind a full buffer, and no turn end of
			// this loop will flush them again: the shard's goroutine
			// mode does (not on the loop: it may wait for room).
			go c.ring.Flush(id)
		}
		ls.runReady()
		ls.unturn() // a detached shard costs its loop nothing per turn
		ls.unturn = nil
	}, nil
}

// CheckAsyncLoop is CheckAsync for a check started on the thread of the
// event loop whose ID is loop: with the client attached to that loop it
// uses the loop's shard, leaves the datagrams queued for the loop's turn
// end (no send, no wake-up now), and an answer read by the loop ends the
// check on the loop (done's CheckDoneOnLoop when it is a LoopCompleter).
// On another loop, or unattached, it is CheckAsync.
func (c *Client) CheckAsyncLoop(loop int, req *wire.RateRequest, out *Decision, done Completer) (Pending, bool, error) {
	if loop < 0 || loop >= len(c.loops) || !c.loops[loop].attached {
		return c.checkAsync(nil, req, out, done)
	}
	return c.checkAsync(c.loops[loop], req, out, done)
}

// flushFrom sends what was queued on shard: at the loop's turn end when
// the caller runs on the loop that owns it, else as flush does.
func (c *Client) flushFrom(ls *loopShard, shard int) {
	if ls != nil && ls.idx == shard && ls.attached {
		ls.dirty = true
		return
	}
	c.flush(shard)
}

// turnEnd runs at the end of every turn of the loop: the Completers of
// checks ended by the turn's reads (normally run already), then one send
// of everything the turn queued on the shard.
func (ls *loopShard) turnEnd() {
	if ls.attached {
		ls.runReady()
		if ls.dirty || ls.blocked {
			ls.dirty = false
			ls.flushOwned()
		}
		if ls.dl.size() > 0 || !ls.armed.IsZero() {
			ls.arm() // after the turn's ends: no wake-up for a deadline decided this turn
		}
	}
	// Last: a Completer run above may start a check, which reads the
	// clock; that time must not carry over the loop's wait into the
	// next turn.
	ls.nowSet = false
}

// Backoff of the flush retries while the shard's socket has a full send
// buffer and the loop has nothing else to do.
const (
	sendRetryMin = 100 * time.Microsecond
	sendRetryMax = 10 * time.Millisecond
)

// flushOwned sends what the turn queued on the shard. A full send buffer
// is backpressure: udpshard keeps the rest queued, in order, and every
// later turn end tries again; so that an idle loop does too, the retry
// timer wakes it after a backoff (a wake-up when the socket turns
// writable would need a write readiness Watch from evloop).
func (ls *loopShard) flushOwned() {
	ls.blocked = ls.c.ring.FlushOwned(ls.idx)
	if !ls.blocked {
		if ls.backoff != 0 {
			ls.backoff = 0
			ls.retry.Stop()
		}
		return
	}
	// The backoff paces an idle loop's retries: it grows when a retry
	// found the buffer still full, not at the turn ends of a busy loop
	// (which retry anyway; they only move the timer).
	if ls.retried || ls.backoff == 0 {
		ls.backoff = min(max(2*ls.backoff, sendRetryMin), sendRetryMax)
	}
	ls.retried = false
	ls.retry.Reset(ls.l.Now() + int64(ls.backoff))
}

// retrySend is the retry timer's function: the turn it runs in ends with
// turnEnd, which flushes.
func (ls *loopShard) retrySend() { ls.retried = true }

// nowOn is the client clock's time for work on ls's loop thread (ls
// attached; nil: any other thread): read once per loop turn and reused by
// the checks the turn starts and the answers it reads, as the loop's own
// timers use one time per turn. It is behind the clock by at most the
// turn's length so far, which wire timestamps (milliseconds, checked with
// seconds of skew) do not notice; a check's start, from which its round
// deadlines count, is read fresh (startOn).
func (c *Client) nowOn(ls *loopShard) time.Time {
	if ls == nil || !ls.attached {
		return c.clock.Now()
	}
	if !ls.nowSet {
		ls.now, ls.nowSet = c.clock.Now(), true
	}
	return ls.now
}

// startOn is the start of a check begun on ls's loop (nil: any other
// thread): always a fresh clock read, which also becomes the turn's time
// for what follows. The caller began deciding (its own clock read) before
// the check, and the request policy's horizon is a promise counted from
// then: a round deadline counted from a turn time read earlier in the
// turn would end the check that much early (an access line showed a
// fail-open after 299.96 ms of a 300 ms horizon).
func (c *Client) startOn(ls *loopShard) time.Time {
	now := c.clock.Now()
	if ls != nil && ls.attached {
		ls.now, ls.nowSet = now, true
	}
	return now
}

// runReady hands the checks ended on the loop to their Completers; loop
// thread, outside the client's locks. A Completer may start checks
// (which never end here synchronously), so the list is walked by index.
func (ls *loopShard) runReady() {
	for i := 0; i < len(ls.ready); i++ {
		d := ls.ready[i]
		ls.ready[i] = readyDone{}
		if lc, ok := d.comp.(LoopCompleter); ok {
			lc.CheckDoneOnLoop(d.out, d.err)
		} else {
			d.comp.CheckDone(d.out, d.err)
		}
	}
	ls.ready = ls.ready[:0]
}

// unlockOnLoop is unlock on the thread of the check's loop, inside the
// read of its shard: the outcome is queued for runReady instead of being
// delivered under the receive path's locks.
func (r *request) unlockOnLoop() {
	if !r.fire {
		r.mu.Unlock()
		return
	}
	c, ls := r.c, r.ls
	r.fire = false
	out, comp := r.out, r.comp
	r.out, r.comp = nil, nil
	r.mu.Unlock()
	err := c.finish(r, out)
	c.c.loopDone.Add(1)
	ls.ready = append(ls.ready, readyDone{comp: comp, out: out, err: err})
}

// loopOwner is udpshard's view of the loop: its Watch and Post, each
// followed by the Completers of the checks the reads ended.
type loopOwner struct{ ls *loopShard }

func (o loopOwner) Watch(fd int, onReadable func()) (func(), error) {
	ls := o.ls
	w, err := ls.l.Watch(fd, func() {
		onReadable()
		ls.runReady()
	})
	if err != nil {
		return nil, err
	}
	return w.Stop, nil
}

func (o loopOwner) Post(fn func()) {
	ls := o.ls
	ls.l.Post(func() {
		fn()
		ls.runReady()
	})
}
