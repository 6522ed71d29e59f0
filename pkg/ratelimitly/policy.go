package ratelimitly

import (
	"errors"
	"fmt"
	"time"

	"github.com/rl-tproxy/rl-tproxy/pkg/ratelimitly/credentials"
)

// DefaultUnit is the round unit U of the named policies when none is given.
const DefaultUnit = 20 * time.Millisecond

// MaxReplays bounds a custom policy's replay count.
const MaxReplays = 16

// Policy names.
const (
	PolicyStandard    = "standard"
	PolicySingleRound = "single_round"
	PolicyCustom      = "custom"
)

// RequestPolicy is the schedule of one rate check (DESIGN.md "RateLimitly
// semantics"): the first send to every endpoint opens a round of Unit;
// each of the Replays replays (to the endpoints still missing) opens a
// round of its gap (ReplayGaps, the last gap repeating when the list is
// shorter, Unit when it is empty); FinalReceive is a last receive-only
// interval; Completion enables completion delivery after a decision.
type RequestPolicy struct {
	Name         string
	Unit         time.Duration
	ReplayGaps   []time.Duration
	Replays      int
	FinalReceive time.Duration
	Completion   bool
}

// Standard is the default policy: send, replay once after U to the
// endpoints still missing, receive only during the third unit, time out at
// 3U; completion delivery on.
func Standard(unit time.Duration) RequestPolicy {
	if unit <= 0 {
		unit = DefaultUnit
	}
	return RequestPolicy{Name: PolicyStandard, Unit: unit, ReplayGaps: []time.Duration{unit}, Replays: 1, FinalReceive: unit, Completion: true}
}

// SingleRound is one send and at most one unit: no replay, no final
// receive, no completion delivery.
func SingleRound(unit time.Duration) RequestPolicy {
	if unit <= 0 {
		unit = DefaultUnit
	}
	return RequestPolicy{Name: PolicySingleRound, Unit: unit}
}

// Gap is the length of the round opened by replay i (0-based).
func (p RequestPolicy) Gap(i int) time.Duration {
	if len(p.ReplayGaps) == 0 {
		return p.Unit
	}
	if i >= len(p.ReplayGaps) {
		i = len(p.ReplayGaps) - 1
	}
	return p.ReplayGaps[i]
}

// Horizon is the time after which a request times out: Unit + the gaps of
// the Replays replays + FinalReceive. It is also the wire ttl_ms (the
// servers' dedup window).
func (p RequestPolicy) Horizon() time.Duration {
	h := p.Unit + p.FinalReceive
	for i := 0; i < p.Replays; i++ {
		h += p.Gap(i)
	}
	return h
}

// Validate checks the policy and that its horizon fits the wire's 16-bit
// ttl_ms and the credential's MaxHorizon (0 = no extra limit).
func (p RequestPolicy) Validate(cred credentials.Credential) error {
	switch {
	case p.Unit <= 0:
		return errors.New("request policy: unit must be positive")
	case p.Replays < 0 || p.Replays > MaxReplays:
		return fmt.Errorf("request policy: replays %d out of range 0..%d", p.Replays, MaxReplays)
	case p.FinalReceive < 0:
		return errors.New("request policy: final receive must not be negative")
	}
	for i, g := range p.ReplayGaps {
		if g <= 0 {
			return fmt.Errorf("request policy: replay gap %d must be positive", i+1)
		}
	}
	h := p.Horizon()
	if ms := CeilMs(h); ms > 65535 {
		return fmt.Errorf("request policy %s: horizon %v exceeds the wire limit of 65535ms", p.Name, h)
	}
	if cred.MaxHorizon > 0 && h > cred.MaxHorizon {
		return fmt.Errorf("request policy %s: horizon %v exceeds the credential's max_horizon %v", p.Name, h, cred.MaxHorizon)
	}
	return nil
}

// CeilMs is d in whole milliseconds, rounded up (the wire's ttl_ms unit).
func CeilMs(d time.Duration) int64 {
	return int64((d + time.Millisecond - 1) / time.Millisecond)
}
