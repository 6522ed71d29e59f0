package hook

import (
	"net/netip"
	"time"

	"github.com/rl-tproxy/rl-tproxy/pkg/exchange"
)

// rejectLogEvery bounds the rejection log to one line per interval: a
// flood of malformed or slow requests must not become a flood of lines.
const rejectLogEvery = time.Second

var _ exchange.Rejecter = (*Gate)(nil)

// Reject implements exchange.Rejecter: every request the proxy answered
// itself under a rule (malformed, too large, too slow) is counted in
// rl_tproxy_rejections_total{status,reason} and logged at warn level, at
// most once per rejectLogEvery, with the number of rejections since the
// previous line.
func (g *Gate) Reject(svc *exchange.Service, remote netip.AddrPort, rule string, status int) {
	g.m.Rejection(status, rule).Inc()
	g.rejectsUnlogged.Add(1)
	now := g.now().UnixNano()
	last := g.lastRejectLog.Load()
	if last != 0 && now-last < int64(rejectLogEvery) || !g.lastRejectLog.CompareAndSwap(last, now) {
		return
	}
	name := "-"
	if svc != nil {
		name = svc.Name
	}
	g.log.Warn("request rejected by the proxy", "service", name, "remote", remote.String(),
		"reason", rule, "status", status, "rejections_since_last_line", g.rejectsUnlogged.Swap(0))
}
