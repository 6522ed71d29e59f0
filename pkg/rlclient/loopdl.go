package rlclient

import (
	"sync"
	"time"

	"github.com/rl-tproxy/rl-tproxy/pkg/evloop"
)

// Deadlines of loop checks. A check started on an attached loop
// (CheckAsyncLoop) keeps its round deadlines (the first round's end,
// replay rounds, the final receive) on its loop shard, not on the
// shard's timer goroutine: one loop timer is armed for the earliest, and
// when it fires the due rounds end on the loop's thread, so a replay is
// queued for the loop's turn-end send and a timeout reaches the
// Completer through CheckDoneOnLoop, with no hand-off and no lock shared
// with the goroutine shards.
//
// The structure is the loop thread's alone. A check ended elsewhere
// (Abort, Close, an answer read on another thread) cannot touch it: it
// invalidates its entry instead (r.lseq moves on, under r.mu) and the
// loop drops the entry when it reaches the head, at the latest at the
// turn end after (see arm), before the loop sleeps. A check ended on
// the loop does the same, so ending a check costs nothing here; the
// common case (decided long before its deadline) is dropped by the
// turn end's look at the head. Entries hold no index back into the
// structure, so a request retired and reused on another loop is never
// written by this one.

// loopEntry is one deadline of a loop check: valid while r is in the
// life gen and its loop deadline is still seq (r.mu).
type loopEntry struct {
	at  time.Time
	r   *request
	gen uint64
	seq uint64
}

// loopDeadlines is a loop shard's deadlines: the first rounds' ends
// arrive in time order and are appended to a FIFO; an earlier one (a
// replay round) goes to a min-heap.
type loopDeadlines struct {
	fifo  []loopEntry // in time order from fhead on
	fhead int
	heap  []loopEntry
}

func (d *loopDeadlines) push(e loopEntry) {
	if n := len(d.fifo); n == d.fhead || !e.at.Before(d.fifo[n-1].at) {
		if n == cap(d.fifo) && d.fhead > 0 { // reuse the front: no allocation in steady state
			k := copy(d.fifo, d.fifo[d.fhead:])
			clear(d.fifo[k:])
			d.fifo = d.fifo[:k]
			d.fhead = 0
		}
		d.fifo = append(d.fifo, e)
		return
	}
	d.heap = append(d.heap, e)
	for i := len(d.heap) - 1; i > 0; {
		p := (i - 1) / 2
		if !d.heap[i].at.Before(d.heap[p].at) {
			break
		}
		d.heap[i], d.heap[p] = d.heap[p], d.heap[i]
		i = p
	}
}

// fromFIFO says whether the earliest entry is the FIFO's head.
func (d *loopDeadlines) fromFIFO() bool {
	return d.fhead < len(d.fifo) && (len(d.heap) == 0 || !d.heap[0].at.Before(d.fifo[d.fhead].at))
}

// peek is the earliest entry.
func (d *loopDeadlines) peek() (loopEntry, bool) {
	switch {
	case d.fromFIFO():
		return d.fifo[d.fhead], true
	case len(d.heap) > 0:
		return d.heap[0], true
	}
	return loopEntry{}, false
}

// pop removes the earliest entry (peek found one).
func (d *loopDeadlines) pop() {
	if d.fromFIFO() {
		d.fifo[d.fhead] = loopEntry{}
		d.fhead++
		if d.fhead == len(d.fifo) {
			d.fifo, d.fhead = d.fifo[:0], 0
		}
		return
	}
	h := d.heap
	n := len(h) - 1
	h[0] = h[n]
	h[n] = loopEntry{}
	d.heap = h[:n]
	for i := 0; ; {
		m, l := i, 2*i+1
		if l < n && d.heap[l].at.Before(d.heap[m].at) {
			m = l
		}
		if r := l + 1; r < n && d.heap[r].at.Before(d.heap[m].at) {
			m = r
		}
		if m == i {
			return
		}
		d.heap[i], d.heap[m] = d.heap[m], d.heap[i]
		i = m
	}
}

// all is every entry, in no order; reset empties the structure.
func (d *loopDeadlines) all(fn func(loopEntry)) {
	for _, e := range d.fifo[d.fhead:] {
		fn(e)
	}
	for _, e := range d.heap {
		fn(e)
	}
}

func (d *loopDeadlines) reset() {
	clear(d.fifo)
	clear(d.heap)
	d.fifo, d.fhead, d.heap = d.fifo[:0], 0, d.heap[:0]
}

// size counts the entries, dead ones included (tests).
func (d *loopDeadlines) size() int { return len(d.fifo) - d.fhead + len(d.heap) }

// live reports whether e is still its request's deadline; no lock held.
func (e *loopEntry) live() bool {
	r := e.r
	r.mu.Lock()
	ok := r.liveLocked(e)
	r.mu.Unlock()
	return ok
}

func (r *request) liveLocked(e *loopEntry) bool {
	return r.gen == e.gen && r.lseq == e.seq && r.onLoop && r.state == statePending
}

// schedule sets r's next round deadline (r.mu held): on its loop for a
// loop check (the caller runs on that loop's thread: the check's start,
// or its loop deadline), else on its shard's timer goroutine.
func (r *request) schedule(at time.Time) {
	if !r.onLoop {
		r.es.schedule(r, at)
		return
	}
	r.lseq++
	ls := r.ls
	ls.dl.push(loopEntry{at: at, r: r, gen: r.gen, seq: r.lseq})
	if ls.armed.IsZero() || at.Before(ls.armed) {
		ls.armed = at
		ls.tm.arm(at)
	}
}

// unschedule drops r's pending deadline (r.mu held; any thread): a loop
// deadline is only invalidated, its loop drops the entry.
func (r *request) unschedule() {
	if r.onLoop {
		r.lseq++
		return
	}
	r.es.unschedule(r)
}

// onDeadline runs on the loop's thread when its timer fired, as a posted
// function: the round ends that are due by the client clock (read fresh:
// the timer may fire a little early, see evTimer) run here, then the
// timer is armed for the next. Posted functions run after the turn's
// reads, the continuation of a read bounded by a flood included (posted
// earlier), so answers that arrived before the deadline decide first, as
// the timer goroutine's Drain makes them do.
func (ls *loopShard) onDeadline() {
	if !ls.attached {
		return
	}
	ls.armed = time.Time{} // fired (or a stale clock-timer post): armed again below
	now := ls.c.clock.Now()
	ls.now, ls.nowSet = now, true
	for {
		e, ok := ls.dl.peek()
		if !ok || e.at.After(now) {
			break
		}
		ls.dl.pop()
		e.r.onLoopDeadline(ls, &e)
	}
	ls.arm()
	ls.runReady()
}

// onLoopDeadline ends a loop check's round on its loop; the datagrams a
// replay queued go out with the turn's send, an end goes to runReady.
func (r *request) onLoopDeadline(ls *loopShard, e *loopEntry) {
	r.mu.Lock()
	if !r.liveLocked(e) {
		r.mu.Unlock()
		return
	}
	shard := r.sock.Shard()
	r.roundEndLocked()
	r.pushed = false // flushed at the turn end, whatever the round queued
	c := r.c
	r.unlockOnLoop()
	c.flushFrom(ls, shard)
}

// arm points the loop timer at the earliest live deadline, dropping the
// dead entries ahead of it; loop thread, no lock held (it takes the
// head's r.mu). It runs at every turn end with deadlines pending, so a
// check decided during the turn does not wake the loop at its old
// deadline.
func (ls *loopShard) arm() {
	for {
		e, ok := ls.dl.peek()
		if !ok {
			if !ls.armed.IsZero() {
				ls.armed = time.Time{}
				ls.tm.stop()
			}
			return
		}
		if e.live() {
			if !ls.armed.Equal(e.at) {
				ls.armed = e.at
				ls.tm.arm(e.at)
			}
			return
		}
		ls.dl.pop()
	}
}

// migrate hands the live deadlines to the shard's timer goroutine when
// the loop detaches (loop thread): those checks end there from now on
// (Stats.LoopHandoffs), unless their loop reads the answer first.
func (ls *loopShard) migrate() {
	ls.tm.detach()
	ls.armed = time.Time{}
	ls.dl.all(func(e loopEntry) {
		r := e.r
		r.mu.Lock()
		if r.liveLocked(&e) {
			r.onLoop = false
			r.lseq++
			r.es.schedule(r, e.at)
		}
		r.mu.Unlock()
	})
	ls.dl.reset()
}

// loopTimer wakes a loop shard at its earliest deadline (onDeadline on
// the loop's thread). Every method runs on the loop's thread.
type loopTimer interface {
	attach(l *evloop.Loop)
	arm(at time.Time) // the client clock's time
	stop()
	detach()
}

// newLoopTimer is the loop's own timer with the wall clock; with any
// other Clock (tests' manual clocks) the Clock's timer, posted to the
// loop: the loop's timer follows the monotonic clock and could not
// follow a clock that moves only when a test says so.
func newLoopTimer(ls *loopShard) loopTimer {
	if _, wall := ls.c.clock.(realClock); wall {
		return &evTimer{ls: ls}
	}
	t := ls.c.clock.NewTimer(time.Hour)
	t.Stop()
	ct := &clockTimer{ls: ls, t: t}
	ls.c.wg.Add(1)
	go ct.run()
	return ct
}

// evTimer is an evloop Timer of the loop.
type evTimer struct {
	ls *loopShard
	t  evloop.Timer
}

func (t *evTimer) attach(l *evloop.Loop) { t.t.Init(l, t.fired) }

// fired is the evloop timer's function: onDeadline, posted (see there).
// A Post from the loop's own thread during its turn costs no wake-up.
func (t *evTimer) fired() { t.ls.l.Post(t.ls.fire) }

// arm converts at to the loop's clock through the turn's time: the
// loop's Now was read at the turn's start, the client's time later, so
// the timer can only fire early (by what the turn took so far), never
// late; onDeadline then finds nothing due and arms again.
func (t *evTimer) arm(at time.Time) {
	d := max(at.Sub(t.ls.c.nowOn(t.ls)), 0)
	t.t.Reset(t.ls.l.Now() + int64(d))
}

func (t *evTimer) stop()   { t.t.Stop() }
func (t *evTimer) detach() { t.t.Stop() }

// clockTimer drives a loop shard's deadlines from the client's Clock: a
// goroutine (one per loop shard, for the client's life) waits for the
// Clock's timer and posts onDeadline to the attached loop.
type clockTimer struct {
	ls *loopShard
	t  Timer
	mu sync.Mutex
	l  *evloop.Loop // where to post; nil while detached
}

func (t *clockTimer) attach(l *evloop.Loop) {
	t.mu.Lock()
	t.l = l
	t.mu.Unlock()
}

func (t *clockTimer) arm(at time.Time) { t.t.ResetAt(at) }
func (t *clockTimer) stop()            { t.t.Stop() }

func (t *clockTimer) detach() {
	t.t.Stop()
	t.attach(nil)
}

func (t *clockTimer) run() {
	c := t.ls.c
	defer c.wg.Done()
	for {
		select {
		case <-c.done:
			return
		case <-t.t.C():
		}
		t.mu.Lock()
		l := t.l
		t.mu.Unlock()
		if l != nil {
			l.Post(t.ls.fire)
		}
	}
}
