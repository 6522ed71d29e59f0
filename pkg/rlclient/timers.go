package rlclient

import (
	"time"
)

// timerEntry is one round deadline; gen detects a request that was retired
// (and possibly reused) before its deadline: such entries are skipped. A
// FIFO entry whose r is nil is dead (its request was retired first).
type timerEntry struct {
	at  time.Time
	r   *request
	gen uint64
}

// Deadlines live in two structures (es.mu). Nearly every deadline is a
// first round's end, start + Unit, and those arrive in time order: they
// are appended to a FIFO and never moved. A request retired early (the
// usual case: it is decided long before its deadline) only clears its
// entry, found through r.fpos (its position + 1; 0 = none), without
// touching the others; dead entries are dropped when they reach the
// head. A deadline earlier than the FIFO's last one (a replay round, or
// checks of one shard that took their start time in one order and the
// lock in the other) goes to a min-heap, removed eagerly (r.hidx). So the
// common schedule/unschedule pair costs O(1), no heap sift, and touches
// no other request's memory. Positions are absolute (es.fbase is the
// position of es.fifo[0]), so dropping the head keeps them valid.

// schedule sets r's next deadline (r.mu is held; lock order r.mu ->
// es.mu). A request has at most one live entry, so the timer goroutine
// wakes only for real deadlines (and for a retired request's FIFO entry
// it had armed for), and is kicked only when the new deadline is earlier
// than the one it sleeps for.
func (es *shardEngine) schedule(r *request, at time.Time) {
	es.mu.Lock()
	es.dropLocked(r)
	es.trimLocked()
	if n := len(es.fifo); n == es.fhead || !at.Before(es.fifo[n-1].at) {
		es.pushFIFOLocked(timerEntry{at: at, r: r, gen: r.gen})
	} else {
		es.heap = append(es.heap, timerEntry{at: at, r: r, gen: r.gen})
		es.up(len(es.heap) - 1)
	}
	kick := es.armed.IsZero() || at.Before(es.armed)
	es.mu.Unlock()
	if kick {
		select {
		case es.wake <- struct{}{}:
		default:
		}
	}
}

// unschedule drops r's pending deadline (r.mu held).
func (es *shardEngine) unschedule(r *request) {
	es.mu.Lock()
	es.dropLocked(r)
	es.mu.Unlock()
}

// dropLocked removes r's pending deadline, if any: from the heap, or by
// clearing its FIFO entry (es.mu held).
func (es *shardEngine) dropLocked(r *request) {
	if r.hidx >= 0 {
		es.removeLocked(r.hidx)
	}
	if r.fpos != 0 {
		if i := r.fpos - 1 - es.fbase; i < uint64(len(es.fifo)) && es.fifo[i].r == r {
			es.fifo[i].r = nil
		}
		r.fpos = 0
	}
}

// pushFIFOLocked appends e, reusing the array's front once the head has
// moved on (no allocation in steady state).
func (es *shardEngine) pushFIFOLocked(e timerEntry) {
	if len(es.fifo) == cap(es.fifo) && es.fhead > 0 {
		n := copy(es.fifo, es.fifo[es.fhead:])
		clear(es.fifo[n:])
		es.fifo = es.fifo[:n]
		es.fbase += uint64(es.fhead)
		es.fhead = 0
	}
	es.fifo = append(es.fifo, e)
	e.r.fpos = es.fbase + uint64(len(es.fifo)) // position + 1
}

// trimLocked drops dead entries from the FIFO's head (es.mu held).
func (es *shardEngine) trimLocked() {
	for es.fhead < len(es.fifo) {
		if es.fifo[es.fhead].r != nil {
			return
		}
		es.fhead++
	}
	es.fbase += uint64(len(es.fifo))
	es.fifo = es.fifo[:0]
	es.fhead = 0
}

// nextLocked is the earliest live deadline (es.mu held).
func (es *shardEngine) nextLocked() (time.Time, bool) {
	es.trimLocked()
	switch {
	case es.fhead < len(es.fifo) && (len(es.heap) == 0 || !es.heap[0].at.Before(es.fifo[es.fhead].at)):
		return es.fifo[es.fhead].at, true
	case len(es.heap) > 0:
		return es.heap[0].at, true
	}
	return time.Time{}, false
}

// popLocked removes the earliest live entry; nextLocked said there is
// one (es.mu held).
func (es *shardEngine) popLocked() timerEntry {
	if es.fhead < len(es.fifo) && (len(es.heap) == 0 || !es.heap[0].at.Before(es.fifo[es.fhead].at)) {
		e := es.fifo[es.fhead]
		es.fifo[es.fhead] = timerEntry{}
		es.fhead++
		e.r.fpos = 0
		return e
	}
	return es.removeLocked(0)
}

// pendingLocked counts live deadlines (es.mu held; tests).
func (es *shardEngine) pendingLocked() int {
	n := len(es.heap)
	for _, e := range es.fifo[es.fhead:] {
		if e.r != nil {
			n++
		}
	}
	return n
}

func (es *shardEngine) swap(i, j int) {
	h := es.heap
	h[i], h[j] = h[j], h[i]
	h[i].r.hidx = i
	h[j].r.hidx = j
}

func (es *shardEngine) up(i int) int {
	es.heap[i].r.hidx = i
	for i > 0 {
		p := (i - 1) / 2
		if !es.heap[i].at.Before(es.heap[p].at) {
			break
		}
		es.swap(i, p)
		i = p
	}
	return i
}

func (es *shardEngine) down(i int) {
	n := len(es.heap)
	for {
		l := 2*i + 1
		if l >= n {
			return
		}
		m := l
		if r := l + 1; r < n && es.heap[r].at.Before(es.heap[l].at) {
			m = r
		}
		if !es.heap[m].at.Before(es.heap[i].at) {
			return
		}
		es.swap(i, m)
		i = m
	}
}

// removeLocked removes entry i (es.mu held).
func (es *shardEngine) removeLocked(i int) timerEntry {
	h := es.heap
	e := h[i]
	e.r.hidx = -1
	n := len(h) - 1
	if i != n {
		h[i] = h[n]
		h[i].r.hidx = i
	}
	h[n] = timerEntry{}
	es.heap = h[:n]
	if i < n {
		es.down(i)
		es.up(i)
	}
	return e
}

// timerLoop is the shard's only timer: it sleeps until the earliest
// deadline and runs the due round ends.
func (es *shardEngine) timerLoop() {
	defer es.c.wg.Done()
	t := es.c.clock.NewTimer(time.Hour)
	defer t.Stop()
	for {
		select {
		case <-es.c.done:
			return
		case <-t.C():
		case <-es.wake:
		}
		drained := false
		for {
			now := es.c.clock.Now()
			es.mu.Lock()
			at, ok := es.nextLocked()
			if !ok {
				es.armed = time.Time{}
				es.mu.Unlock()
				t.Stop()
				break
			}
			if at.After(now) {
				es.armed = at
				es.mu.Unlock()
				t.ResetAt(at)
				break
			}
			if !drained {
				// A deadline is due. Before acting on missing answers, take
				// in those already queued on this shard's sockets: after a
				// stall (or while the readers wait for a CPU) the timer can
				// run first, and a round end would otherwise replay or time
				// out requests whose answers are sitting in the socket.
				// Drained answers may decide and unschedule requests, so
				// look at the heap again.
				es.mu.Unlock()
				drained = true
				es.c.ring.Drain(es.idx)
				continue
			}
			e := es.popLocked()
			es.mu.Unlock()
			e.r.onTimer(e.gen)
		}
	}
}
