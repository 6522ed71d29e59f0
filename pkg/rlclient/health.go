package rlclient

import (
	"crypto/rand"
	randv2 "math/rand/v2"
	"sync/atomic"
	"time"

	"github.com/rl-tproxy/rl-tproxy/pkg/ratelimitly/wire"
)

// Endpoint health. An endpoint that gave no valid answer to its last
// MissLimit requests, the first of which is older than the request horizon,
// leaves the usable set: checks neither send to it nor wait for it (it
// cannot be "the oldest known endpoint"). The prober sends it a probe every
// ProbeInterval; its first valid answer (to a probe, or a late answer to
// any request) makes it usable again. When no endpoint is usable a check
// sends to all of them.
const (
	MissLimit     = 3
	ProbeInterval = time.Second
	// WarnInterval bounds the warning logged while checks fail for lack of
	// a RateLimitly decision to one per interval.
	WarnInterval = 10 * time.Second
	// ProbeService is the guard service of a probe: a RATE_REQUEST with
	// this one guard (threshold 4294967295 ms) and no resource, which a
	// server answers without consuming anything.
	ProbeService = "rl-tproxy.probe"
)

// health is what the client knows about an endpoint's answers.
type health struct {
	pending atomic.Int64 // requests sent since the last valid answer
	since   atomic.Int64 // clock time (unix ns) of the first of them
}

// sent counts a request sent to the endpoint. The first request of an
// episode stores since before it makes pending 1 (a CAS), so a concurrent
// usable never sees MissLimit pending requests with a stale since.
func (h *health) sent(now int64) {
	for {
		p := h.pending.Load()
		if p != 0 {
			if h.pending.CompareAndSwap(p, p+1) {
				return
			}
			continue
		}
		h.since.Store(now)
		if sentPause != nil {
			sentPause()
		}
		if h.pending.CompareAndSwap(0, 1) {
			return
		}
	}
}

// sentPause, when set (tests), runs while sent starts an episode: after
// since is stored, before pending counts the request.
var sentPause func()

// validAnswer records a valid answer: the endpoint is usable again.
func (h *health) validAnswer() {
	if h.pending.Load() != 0 {
		h.pending.Store(0)
	}
}

// usable reports whether the endpoint answered recently enough.
func (h *health) usable(now int64, horizon time.Duration) bool {
	return h.pending.Load() < MissLimit || now-h.since.Load() < int64(horizon)
}

// usableMask is the set of usable endpoints (every endpoint when none is).
func (c *Client) usableMask(m *membership, now int64) uint64 {
	all := uint64(1)<<uint(len(m.eps)) - 1
	var mask uint64
	for i, e := range m.eps {
		if e.health.usable(now, c.horizon) {
			mask |= 1 << uint(i)
		}
	}
	if mask == 0 {
		return all
	}
	return mask
}

// usableCount is the number of usable endpoints now (0 when none is).
func (c *Client) usableCount(m *membership) int {
	now := c.clock.Now().UnixNano()
	n := 0
	for _, e := range m.eps {
		if e.health.usable(now, c.horizon) {
			n++
		}
	}
	return n
}

// proberLoop probes unusable endpoints every ProbeInterval.
func (c *Client) proberLoop() {
	defer c.wg.Done()
	t := c.clock.NewTimer(ProbeInterval)
	defer t.Stop()
	var pkt [wire.MaxDatagram]byte
	req := wire.RateRequest{Guards: []wire.Guard{{Service: []byte(ProbeService), ThresholdMs: 1<<32 - 1}}}
	for {
		select {
		case <-c.done:
			return
		case <-t.C():
		}
		c.probeOnce(&req, pkt[:0])
		t.ResetAt(c.clock.Now().Add(ProbeInterval))
	}
}

// probeOnce sends one probe to every unusable endpoint. The probes of a
// round share one request id (answers to it are recognised as probe
// answers, not late answers).
func (c *Client) probeOnce(req *wire.RateRequest, buf []byte) {
	m := c.disc.current()
	if m == nil {
		return
	}
	now := c.clock.Now()
	shard := c.goShard()
	id := randv2.Uint64() &^ tokenMask
	queued := false
	for _, e := range m.eps {
		if e.health.usable(now.UnixNano(), c.horizon) {
			continue
		}
		c.probeID.Store(id)
		h := wire.Header{Kind: wire.KindRateRequest, TTLms: c.ttlMs, RequestID: id, Timestamp: uint64(now.UnixMilli())}
		if _, err := rand.Read(h.Nonce[:]); err != nil {
			continue
		}
		pkt, err := c.key.Seal(buf, &h, req)
		if err != nil {
			continue
		}
		if c.ring.PushCurrent(shard, e.Addr, pkt, 0) == nil { // Push copies pkt
			c.c.probes.Add(1)
			queued = true
		}
	}
	if queued {
		c.ring.Flush(shard)
	}
}

// failWarn rate-limits the warning about checks that end without a
// RateLimitly decision.
type failWarn struct {
	next   atomic.Int64  // clock time (unix ns) before which nothing is logged
	failed atomic.Uint64 // failures since the last warning
}

// noteFailure counts a check that ended for lack of RateLimitly and logs
// at most one warning per WarnInterval.
func (c *Client) noteFailure(cause Cause) {
	switch cause {
	case CauseNoEndpoints, CauseSendFailure, CauseTimeout, CauseProtocol, CauseCardinality:
	default:
		return
	}
	c.warn.failed.Add(1)
	now := c.clock.Now().UnixNano()
	next := c.warn.next.Load()
	if now < next || !c.warn.next.CompareAndSwap(next, now+int64(WarnInterval)) {
		return
	}
	endpoints, usable := 0, 0
	if m := c.disc.current(); m != nil {
		endpoints, usable = len(m.eps), c.usableCount(m)
	}
	c.c.warns.Add(1)
	c.log.Warn("rlclient: checks end without a RateLimitly decision; the failure policy decides them",
		"cause", cause.String(), "failed_checks", c.warn.failed.Swap(0), "endpoints", endpoints,
		"usable_endpoints", usable, "srv", c.cfg.SRV, "every", WarnInterval)
}
