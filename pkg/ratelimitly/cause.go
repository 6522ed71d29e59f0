package ratelimitly

import "github.com/rl-tproxy/rl-tproxy/pkg/ratelimitly/wire"

// Cause says why a rate check, and the admission of the request around it,
// ended as it did. It is the one vocabulary of the project: the client
// (pkg/rlclient) ends every check with one, the admission engine
// (pkg/admission) records one per request, and the access log and metrics
// print its String. The decisions are CauseAllow and the CauseDeny*
// values; every other cause means there is no valid decision.
type Cause uint8

// Causes, in the order of metrics' label values.
const (
	CauseAllow        Cause = iota // valid allow
	CauseDenyResource              // valid deny: a resource had tokens_deficit > 0
	CauseDenyGuard                 // valid deny: a guard did not pass
	CauseDenyRefused               // valid response, success false, no resource short and every guard passed
	CauseNoEndpoints               // no usable discovery target
	CauseSendFailure               // UDP send failure
	CauseTimeout                   // no valid response before the horizon
	CauseProtocol                  // authentication or protocol failure
	CauseCardinality               // result arrays did not match the request
	CauseInvalidValue              // a rendered bucket/service/label broke a limit
	CauseConstruction              // the request could not be built (too many items, datagram too large)
	CauseCancelled                 // the client went away during the check
	CauseUnprotected               // matched a location without limit or guard
	CauseUnmatched                 // no service or location matched
	CauseInternal                  // internal failure
	NumCauses                      // the number of causes
)

var causeNames = [NumCauses]string{
	"allow", "deny_resource", "deny_guard", "deny_refused", "no_endpoints", "send_failure",
	"timeout", "protocol", "cardinality", "invalid_value", "construction", "cancelled", "unprotected",
	"unmatched", "internal",
}

func (c Cause) String() string {
	if c < NumCauses {
		return causeNames[c]
	}
	return "unknown"
}

// CauseNames lists every cause name in index order.
func CauseNames() []string { return causeNames[:] }

// Decided reports whether c is a valid decision (allow or a deny).
func (c Cause) Decided() bool { return c <= CauseDenyRefused }

// Denied reports whether c is a valid deny.
func (c Cause) Denied() bool { return c >= CauseDenyResource && c <= CauseDenyRefused }

// IsFailure reports whether c means "no valid decision" for a reason the
// failure policy covers (an unreachable or misbehaving RateLimitly, or a
// request that could not be built).
func (c Cause) IsFailure() bool {
	switch c {
	case CauseNoEndpoints, CauseSendFailure, CauseTimeout, CauseProtocol, CauseCardinality,
		CauseInvalidValue, CauseConstruction:
		return true
	}
	return false
}

// Classify applies the allow contract to a response for a request of
// nGuards guards and nResources resources: allow only when the status is
// OK, success is true, every guard passed, every tokens_deficit is 0 and
// the result arrays have exactly the cardinality sent. A cardinality
// mismatch (CauseCardinality) and a status other than OK (CauseProtocol)
// are failures, never decisions: such an answer is not a valid answer, so
// the client replays to its server and the failure policy applies if no
// server gives a valid one.
func Classify(resp *wire.RateResponse, nGuards, nResources int) Cause {
	if len(resp.Guards) != nGuards || len(resp.Resources) != nResources {
		return CauseCardinality
	}
	if resp.Status != wire.StatusOK {
		return CauseProtocol
	}
	for i := range resp.Resources {
		if resp.Resources[i].TokensDeficit != 0 {
			return CauseDenyResource
		}
	}
	for i := range resp.Guards {
		if !resp.Guards[i].Passed {
			return CauseDenyGuard
		}
	}
	if !resp.Success {
		return CauseDenyRefused
	}
	return CauseAllow
}
