package rlclient

import (
	"time"
)

// timerEntry is one round deadline; gen detects a request that was retired
// (and possibly reused) before its deadline: such entries are skipped.
type timerEntry struct {
	at  time.Time
	r   *request
	gen uint64
}

// schedule sets r's next deadline (r.mu is held; lock order r.mu ->
// es.mu). A request has at most one entry; it is removed when the request
// ends, so the timer goroutine wakes only for real deadlines, and is kicked
// only when the new deadline is earlier than the one it sleeps for.
func (es *shardEngine) schedule(r *request, at time.Time) {
	es.mu.Lock()
	if r.hidx >= 0 {
		es.removeLocked(r.hidx)
	}
	es.heap = append(es.heap, timerEntry{at: at, r: r, gen: r.gen})
	i := es.up(len(es.heap) - 1)
	kick := i == 0 && (es.armed.IsZero() || at.Before(es.armed))
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
	if r.hidx >= 0 {
		es.removeLocked(r.hidx)
	}
	es.mu.Unlock()
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

// popLocked removes the earliest entry (es.mu held).
func (es *shardEngine) popLocked() timerEntry { return es.removeLocked(0) }

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
			if len(es.heap) == 0 {
				es.armed = time.Time{}
				es.mu.Unlock()
				t.Stop()
				break
			}
			if at := es.heap[0].at; at.After(now) {
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
