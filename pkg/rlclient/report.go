package rlclient

import (
	randv2 "math/rand/v2"
	"time"

	"github.com/rl-tproxy/rl-tproxy/pkg/ratelimitly/wire"
)

// Report sends one latency report for service to every endpoint, fire and
// forget: it never blocks on the network and a failure only counts.
// Duration is sent in milliseconds clamped to 1..4294967295.
func (c *Client) Report(service []byte, d time.Duration) {
	m := c.disc.current()
	if c.closed.Load() || m == nil || len(service) == 0 || len(service) > wire.MaxName {
		c.c.reportsDropped.Add(1)
		return
	}
	ms := d.Milliseconds()
	if ms < 1 {
		ms = 1
	} else if ms > 1<<32-1 {
		ms = 1<<32 - 1
	}
	shard := c.goShard()
	es := c.shards[shard]
	es.txMu.Lock()
	defer es.txMu.Unlock()
	es.rep.Entries = append(es.rep.Entries[:0], wire.ReportEntry{Service: service, DurationMs: uint32(ms)})
	h := &es.rhdr
	*h = wire.Header{TTLms: c.ttlMs, RequestID: randv2.Uint64() &^ tokenMask, Timestamp: uint64(c.clock.Now().UnixMilli())}
	pkt, err := c.key.Seal(es.rpkt[:0], h, &es.rep)
	es.rep.Entries[0].Service = nil
	if err != nil {
		c.c.reportsDropped.Add(1)
		return
	}
	for _, ep := range m.eps {
		if c.ring.PushCurrent(shard, ep.Addr, pkt, 0) != nil {
			c.c.reportsDropped.Add(1)
			continue
		}
		c.c.reports.Add(1)
	}
	c.ring.FlushAsync(shard)
}
