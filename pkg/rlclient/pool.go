package rlclient

import (
	"sync"
	"time"
)

// reqPool recycles request state (a plain free list: unlike sync.Pool it
// is not emptied by every GC, so steady state does not allocate). After a
// burst it shrinks: while more than poolKeep entries are free, a timer
// drops, every poolIdle, the entries that stayed unused for the whole
// interval (the oldest, at the bottom of the stack). The timer allocates
// once per interval at most, never per request.
type reqPool struct {
	mu      sync.Mutex
	free    []*request
	low     int // fewest free entries since the last trim
	timer   *time.Timer
	stopped bool
}

const (
	poolKeep = 64
	poolIdle = 10 * time.Second
)

func (p *reqPool) get(c *Client) *request {
	p.mu.Lock()
	if n := len(p.free); n > 0 {
		r := p.free[n-1]
		p.free[n-1] = nil
		p.free = p.free[:n-1]
		p.low = min(p.low, n-1)
		p.mu.Unlock()
		return r
	}
	p.low = 0
	p.mu.Unlock()
	return &request{c: c, hidx: -1}
}

func (p *reqPool) put(r *request) {
	r.mu.Lock()
	r.gen++
	r.id = 0
	r.state = stateDone
	r.mem = nil
	r.sock = nil
	r.es = nil
	r.onLoop = false
	r.out, r.comp, r.fire = nil, nil, false
	r.mu.Unlock()
	p.mu.Lock()
	p.free = append(p.free, r)
	if len(p.free) > poolKeep && p.timer == nil && !p.stopped {
		p.low = len(p.free)
		p.timer = time.AfterFunc(poolIdle, p.trim)
	}
	p.mu.Unlock()
}

// trim drops the entries no get needed since the last trim, keeping at
// least poolKeep, and re-arms while more than poolKeep remain.
func (p *reqPool) trim() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.timer = nil
	if p.stopped {
		return
	}
	drop := min(p.low, len(p.free)-poolKeep)
	if drop > 0 {
		n := copy(p.free, p.free[drop:])
		clear(p.free[n:])
		p.free = p.free[:n]
		if cap(p.free) > 4*poolKeep && n < cap(p.free)/4 {
			p.free = append([]*request(nil), p.free...) // give the burst's array back
		}
	}
	p.low = len(p.free)
	if len(p.free) > poolKeep {
		p.timer = time.AfterFunc(poolIdle, p.trim)
	}
}

// stop ends the trim timer (Client.Close).
func (p *reqPool) stop() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.stopped = true
	if p.timer != nil {
		p.timer.Stop()
		p.timer = nil
	}
}

// freeCount is the number of pooled entries (tests).
func (p *reqPool) freeCount() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.free)
}
