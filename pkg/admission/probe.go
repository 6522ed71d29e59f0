package admission

import (
	"sync"
	"time"
)

// probeRate is deny.guard_probe as written: Rate requests per PeriodMs.
type probeRate struct {
	Rate, PeriodMs uint32
}

// GuardProbe is a location's probe budget on this node: a token bucket
// of Rate tokens per Period, holding at most Rate (at least 1), that
// starts full. While the location's latency guards deny, each token lets
// one such request through as a probe (OutcomeGuardProbe), so that its
// latency report reaches the tracker: a guard that sees no reports would
// keep the slow samples it has until they age out of its window. Safe
// for concurrent use; Take allocates nothing.
type GuardProbe struct {
	Rate   uint32
	Period time.Duration

	mu     sync.Mutex
	tokens float64
	last   time.Time
}

func newGuardProbe(r probeRate) *GuardProbe {
	return &GuardProbe{Rate: r.Rate, Period: time.Duration(r.PeriodMs) * time.Millisecond, tokens: probeCap(r.Rate)}
}

func probeCap(rate uint32) float64 { return float64(max(rate, 1)) }

// Take spends one token at now if there is one.
func (p *GuardProbe) Take(now time.Time) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.last.IsZero() {
		if dt := now.Sub(p.last); dt > 0 {
			p.tokens = min(probeCap(p.Rate), p.tokens+float64(p.Rate)*float64(dt)/float64(p.Period))
		}
	}
	if p.last.IsZero() || now.After(p.last) {
		p.last = now
	}
	if p.tokens < 1 {
		return false
	}
	p.tokens--
	return true
}
