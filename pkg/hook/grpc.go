package hook

import (
	"strings"

	"github.com/rl-tproxy/rl-tproxy/pkg/admission"
	"github.com/rl-tproxy/rl-tproxy/pkg/exchange"
)

// GRPCDeny says how a deny reads to a gRPC client (pkg/h2proxy's
// GRPCDenier): the location's deny.grpc_status (RESOURCE_EXHAUSTED by
// default) and a message naming the zones that were short and the latency
// guards that failed (as the access line does), or the failure that
// closed.
func (g *Gate) GRPCDeny(d *exchange.Decision) (int, string) {
	st, _ := d.State.(*state)
	if st == nil || st.dec.Location == nil {
		return admission.DefaultDenyGRPCStatus, "rate limited"
	}
	dec := &st.dec
	code := dec.Location.Deny.GRPCStatus
	if code == 0 {
		code = admission.DefaultDenyGRPCStatus
	}
	zones, guards := deniedBy(dec)
	var what []string
	if zones != "" {
		what = append(what, "zone "+zones)
	}
	if guards != "" {
		what = append(what, "latency guard "+guards)
	}
	switch {
	case len(what) > 0:
		return code, "rate limited by " + strings.Join(what, ", ")
	case dec.Verdict != admission.VerdictDeny:
		return code, "rate limit check failed (" + dec.Cause.String() + ", fail: close)"
	}
	return code, "rate limited"
}
