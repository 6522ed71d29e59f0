package hook

import (
	"strings"

	"github.com/rl-tproxy/rl-tproxy/pkg/admission"
	"github.com/rl-tproxy/rl-tproxy/pkg/proxy"
)

// GRPCDeny says how a deny reads to a gRPC client (pkg/h2proxy's
// GRPCDenier): the location's deny.grpc_status (RESOURCE_EXHAUSTED by
// default) and a message naming the zones that were short, the latency
// guards that failed, or the failure that closed.
func (g *Gate) GRPCDeny(d *proxy.Decision) (int, string) {
	st, _ := d.State.(*state)
	if st == nil || st.dec.Location == nil {
		return admission.DefaultDenyGRPCStatus, "rate limited"
	}
	dec, loc := &st.dec, st.dec.Location
	code := loc.Deny.GRPCStatus
	if code == 0 {
		code = admission.DefaultDenyGRPCStatus
	}
	var what []string
	res := &dec.Result
	for i, z := range loc.Limits {
		short := false
		if res.Valid && i < len(res.Resp.Resources) {
			short = res.Resp.Resources[i].TokensDeficit > 0
		} else if i < len(dec.Zones) {
			short = dec.Zones[i].Known && dec.Zones[i].RetryAfterMs > 0
		}
		if short {
			what = append(what, "zone "+z.Name)
		}
	}
	if res.Valid {
		for i, gd := range loc.Guards {
			if i < len(res.Resp.Guards) && !res.Resp.Guards[i].Passed {
				what = append(what, "latency guard "+gd.Tracker.Name)
			}
		}
	}
	switch {
	case len(what) > 0:
		return code, "rate limited by " + strings.Join(what, ", ")
	case dec.Verdict != admission.VerdictDeny:
		return code, "rate limit check failed (" + dec.Cause.String() + ", fail: close)"
	}
	return code, "rate limited"
}
