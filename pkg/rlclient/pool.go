package rlclient

import (
	"sync"
)

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
	return &request{c: c, done: make(chan struct{}, 1), hidx: -1}
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
