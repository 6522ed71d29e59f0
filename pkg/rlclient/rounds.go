package rlclient

import (
	"math/bits"
	"time"

	"github.com/rl-tproxy/rl-tproxy/pkg/ratelimitly"
	"github.com/rl-tproxy/rl-tproxy/pkg/ratelimitly/wire"
)

// onTimer runs at the end of a round.
func (r *request) onTimer(gen uint64) {
	r.mu.Lock()
	if r.gen != gen || r.state != statePending {
		r.mu.Unlock()
		return
	}
	shard := r.sock.Shard()
	r.roundEndLocked()
	r.pushed = false // flushed below, whatever the round queued
	c := r.c
	r.unlock()
	c.flush(shard)
}

// roundEndLocked applies the end-of-round rules (r.mu held).
func (r *request) roundEndLocked() {
	p := &r.c.policy
	if r.valid != 0 {
		r.c.c.decidedAtUnit.Add(1)
		r.decideLocked()
		return
	}
	switch {
	case r.round < p.Replays:
		deadline := r.roundEnd()
		r.round++
		r.attempt++
		r.answered = r.valid // replay to every endpoint without a valid answer
		r.sendRound(r.c.clock.Now())
		r.schedule(deadline.Add(p.Gap(r.round - 1)))
	case r.round == p.Replays && p.FinalReceive > 0:
		deadline := r.roundEnd()
		r.round++
		r.schedule(deadline.Add(p.FinalReceive))
	default:
		r.finishLocked(r.failCause())
	}
}

// roundEnd is the scheduled end of the current round.
func (r *request) roundEnd() time.Time {
	p := &r.c.policy
	t := r.start.Add(p.Unit)
	for i := 0; i < r.round && i < p.Replays; i++ {
		t = t.Add(p.Gap(i))
	}
	return t
}

func (r *request) failCause() Cause {
	switch {
	case r.sawCard:
		return CauseCardinality
	case r.sawProto:
		return CauseProtocol
	case r.answered == 0 && r.sendFailed == r.full:
		return CauseSendFailure
	}
	return CauseTimeout
}

func (r *request) decideLocked() {
	r.finishLocked(r.bestCause)
}

// afterAnswer applies the early-decision rules. r.mu is held.
func (r *request) afterAnswer(i int) {
	if r.state != statePending {
		return
	}
	if r.answered&r.full == r.full {
		switch {
		case r.valid != 0:
			r.decideEarly()
		case r.round >= r.c.policy.Replays:
			// Every endpoint answered the last send and none validly:
			// no replay is left that could change that.
			r.finishLocked(r.failCause())
		}
		// Otherwise the round's end replays to them.
		return
	}
	if r.valid&(1<<uint(i)) == 0 {
		return
	}
	if r.round > r.c.policy.Replays { // final receive: first valid answer decides
		r.decideEarly()
		return
	}
	// The oldest known endpoint answered: no other endpoint this check
	// sent to has a known smaller epoch (unusable endpoints, not sent to,
	// cannot be waited for).
	e := r.mem.eps[i].epoch.Load()
	for others := r.full &^ (1 << uint(i)); others != 0; {
		j := bits.TrailingZeros64(others)
		others &^= 1 << uint(j)
		if o := r.mem.eps[j].epoch.Load(); o != 0 && o < e {
			return
		}
	}
	r.decideEarly()
}

// decideEarly decides on an answer, before any deadline.
func (r *request) decideEarly() {
	r.c.c.decidedEarly.Add(1)
	r.decideLocked()
}

// onSendError marks an endpoint whose datagram the kernel refused.
func (c *Client) onSendError(token uint64, _ error) {
	r := c.table.get(token &^ tokenMask)
	if r == nil {
		return
	}
	r.mu.Lock()
	if r.id != token&^tokenMask || r.state != statePending {
		r.mu.Unlock()
		return
	}
	if i := int(token & tokenMask); i < len(r.mem.eps) {
		r.sendFailed |= 1 << uint(i)
		if r.answered == 0 && r.sendFailed == r.full {
			r.finishLocked(CauseSendFailure)
		}
	}
	r.unlock()
}

// acceptLocked records a valid answer and keeps it if it is the oldest.
func (r *request) acceptLocked(i int, resp *wire.RateResponse) {
	e := resp.ServerEpoch
	ep := r.mem.eps[i]
	ep.epoch.Store(e)
	ep.health.validAnswer()
	r.valid |= 1 << uint(i)
	if r.best >= 0 && r.bestEpoch <= e {
		return
	}
	r.best, r.bestEpoch = i, e
	copy(r.guards[:], resp.Guards)
	copy(r.resources[:], resp.Resources)
	r.bestCause = ratelimitly.Classify(resp, int(r.nGuards), int(r.nResources))
}
