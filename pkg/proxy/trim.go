package proxy

import (
	"runtime"
	"runtime/debug"
	"sync/atomic"
	"time"
)

// After a burst, the connections, buffers and goroutine stacks it needed
// are garbage, but sync.Pool keeps pooled objects for two GC cycles, and a
// quiet process may not run one for minutes (the runtime forces one every
// two minutes) nor return the freed pages at once. So when the open
// connections and the live watchers have both fallen to 1/32 of a
// peak of at least trimAfterBurst, the proxy runs the two cycles and
// returns free memory to the OS itself, at most once per trimEvery, and
// once more trimFollowUp later for what other pools (the RateLimitly
// client's request states, for one) let go of in the meantime.
const (
	trimAfterBurst = 256
	trimEvery      = time.Minute
	trimFollowUp   = 30 * time.Second
)

// trimState is guarded by Proxy.mu.
type trimState struct {
	count    atomic.Uint64 // trims done (tests)
	high     int           // peak of open connections or live watchers since the last trim
	last     time.Time     // last trim
	followUp *time.Timer   // the pending second trim
	stopped  bool          // Shutdown: no more trims
}

// noteTrimLocked records n connections or watchers; p.mu is held.
func (p *Proxy) noteTrimLocked(n int) {
	if n > p.trim.high {
		p.trim.high = n
	}
}

// trimDueLocked reports whether a burst just ended (see above) and, if
// so, starts a new peak; p.mu is held.
func (p *Proxy) trimDueLocked() bool {
	h := p.trim.high
	if h < trimAfterBurst || len(p.conns) > h/32 {
		return false
	}
	w := p.watchers.count()
	if w > h/32 {
		return false
	}
	now := time.Now()
	if p.trim.stopped || now.Sub(p.trim.last) < trimEvery {
		return false
	}
	p.trim.last, p.trim.high = now, max(len(p.conns), w)
	if p.trim.followUp != nil {
		p.trim.followUp.Stop()
	}
	p.trim.followUp = time.AfterFunc(trimFollowUp, p.trimMemory)
	return true
}

// stopTrim cancels a pending follow-up trim (Shutdown).
func (p *Proxy) stopTrim() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.trim.stopped = true
	if p.trim.followUp != nil {
		p.trim.followUp.Stop()
		p.trim.followUp = nil
	}
}

// checkTrim runs after watchers ended.
func (p *Proxy) checkTrim() {
	p.mu.Lock()
	due := p.trimDueLocked()
	p.mu.Unlock()
	if due {
		go p.trimMemory()
	}
}

// trimMemory empties the pools (two GC cycles) and returns free memory to
// the OS.
func (p *Proxy) trimMemory() {
	runtime.GC()
	debug.FreeOSMemory()
	p.trim.count.Add(1)
}
