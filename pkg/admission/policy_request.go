package admission

import (
	"strconv"
	"time"
)

// RequestPolicy is the RateLimitly request policy (fan-out, replay,
// completion) as the policy file selects it. It mirrors the shape of
// rlclient.RequestPolicy field for field.
type RequestPolicy struct {
	Name         string
	Unit         time.Duration
	ReplayGaps   []time.Duration
	Replays      int
	FinalReceive time.Duration
	Completion   bool
}

// DefaultUnit is the request-policy unit when none is set.
const DefaultUnit = 20 * time.Millisecond

// StandardPolicy is `standard`: one replay after one unit, one final
// receive-only unit, completion delivery on. Horizon 3U.
func StandardPolicy(unit time.Duration) RequestPolicy {
	return RequestPolicy{Name: PolicyStandard, Unit: unit, ReplayGaps: []time.Duration{unit}, Replays: 1, FinalReceive: unit, Completion: true}
}

// SingleRoundPolicy is `single_round`: one send, one unit, no replay, no
// completion. Horizon U.
func SingleRoundPolicy(unit time.Duration) RequestPolicy {
	return RequestPolicy{Name: PolicySingleRound, Unit: unit}
}

// Horizon is the longest a request can take, which is also its wire TTL:
// the gaps of its replays (the last listed gap repeats when the list is
// shorter than Replays), plus the first unit, plus the final receive-only
// interval. standard = 3U, single_round = U.
func (p RequestPolicy) Horizon() time.Duration {
	h := p.Unit + p.FinalReceive
	for i := 0; i < p.Replays && len(p.ReplayGaps) > 0; i++ {
		g := p.ReplayGaps[len(p.ReplayGaps)-1]
		if i < len(p.ReplayGaps) {
			g = p.ReplayGaps[i]
		}
		h += g
		if h > 1<<40 { // far beyond any valid horizon; stop before overflow
			return h
		}
	}
	return h
}

func itoa(n int) string { return strconv.Itoa(n) }

func plural(n int, what string) string {
	if n == 1 {
		return "1 " + what
	}
	return itoa(n) + " " + what + "s"
}
