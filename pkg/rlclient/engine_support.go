package rlclient

import (
	"sync"
	"time"
)

// timerEntry is one round deadline; gen detects a request that was retired
// (and possibly reused) before its deadline: such entries are skipped.
type timerEntry struct {
	at  time.Time
	r   *request
	gen uint64
}

// schedule adds a deadline for r (r.mu is held; lock order r.mu -> es.mu).
func (es *eshard) schedule(r *request, at time.Time) {
	es.mu.Lock()
	es.heap = append(es.heap, timerEntry{at: at, r: r, gen: r.gen})
	i := len(es.heap) - 1
	for i > 0 {
		p := (i - 1) / 2
		if !es.heap[i].at.Before(es.heap[p].at) {
			break
		}
		es.heap[i], es.heap[p] = es.heap[p], es.heap[i]
		i = p
	}
	first := i == 0
	es.mu.Unlock()
	if first {
		select {
		case es.wake <- struct{}{}:
		default:
		}
	}
}

// popLocked removes the earliest entry (es.mu held).
func (es *eshard) popLocked() timerEntry {
	h := es.heap
	top := h[0]
	n := len(h) - 1
	h[0] = h[n]
	h[n] = timerEntry{}
	h = h[:n]
	i := 0
	for {
		l := 2*i + 1
		if l >= n {
			break
		}
		m := l
		if r := l + 1; r < n && h[r].at.Before(h[l].at) {
			m = r
		}
		if !h[m].at.Before(h[i].at) {
			break
		}
		h[i], h[m] = h[m], h[i]
		i = m
	}
	es.heap = h
	return top
}

// timerLoop is the shard's only timer: it sleeps until the earliest
// deadline and runs the due round ends.
func (es *eshard) timerLoop() {
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
		for {
			now := es.c.clock.Now()
			es.mu.Lock()
			if len(es.heap) == 0 {
				es.mu.Unlock()
				t.Reset(time.Hour)
				break
			}
			if d := es.heap[0].at.Sub(now); d > 0 {
				es.mu.Unlock()
				t.Reset(d)
				break
			}
			e := es.popLocked()
			es.mu.Unlock()
			e.r.onTimer(e.gen)
		}
	}
}

// reqTable maps live request ids to their state, striped to spread lock
// contention. Ids have their low 6 bits zero (tokenMask); bits 6..11 pick
// the stripe.
type reqTable struct {
	stripes [64]tableStripe
}

type tableStripe struct {
	mu sync.Mutex
	m  map[uint64]*request
	_  [40]byte
}

func (t *reqTable) init() {
	for i := range t.stripes {
		t.stripes[i].m = make(map[uint64]*request, 64)
	}
}

func (t *reqTable) stripe(id uint64) *tableStripe { return &t.stripes[(id>>6)&63] }

func (t *reqTable) put(r *request) {
	s := t.stripe(r.id)
	s.mu.Lock()
	s.m[r.id] = r
	s.mu.Unlock()
}

func (t *reqTable) get(id uint64) *request {
	s := t.stripe(id)
	s.mu.Lock()
	r := s.m[id]
	s.mu.Unlock()
	return r
}

func (t *reqTable) remove(id uint64) {
	s := t.stripe(id)
	s.mu.Lock()
	delete(s.m, id)
	s.mu.Unlock()
}

// failAll ends every live request with CauseCancelled (Close).
func (t *reqTable) failAll(*Client) {
	var live []*request
	for i := range t.stripes {
		s := &t.stripes[i]
		s.mu.Lock()
		for _, r := range s.m {
			live = append(live, r)
		}
		s.mu.Unlock()
	}
	for _, r := range live {
		r.mu.Lock()
		r.finishLocked(CauseCancelled)
		r.mu.Unlock()
	}
}

// reqPool recycles request state (a plain free list: unlike sync.Pool it
// is never emptied by the GC, so steady state does not allocate).
type reqPool struct {
	mu   sync.Mutex
	free []*request
}

func (p *reqPool) get(c *Client) *request {
	p.mu.Lock()
	if n := len(p.free); n > 0 {
		r := p.free[n-1]
		p.free[n-1] = nil
		p.free = p.free[:n-1]
		p.mu.Unlock()
		return r
	}
	p.mu.Unlock()
	return &request{c: c, done: make(chan struct{}, 1)}
}

func (p *reqPool) put(r *request) {
	r.mu.Lock()
	r.gen++
	r.id = 0
	r.state = stateDone
	r.mem = nil
	r.sock = nil
	r.es = nil
	r.mu.Unlock()
	p.mu.Lock()
	p.free = append(p.free, r)
	p.mu.Unlock()
}
