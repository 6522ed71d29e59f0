package admission

import (
	"time"

	"github.com/rl-tproxy/rl-tproxy/pkg/ratelimitly"
)

// Verdict is the decision provenance signal: allow only after a valid
// response satisfied the whole allow contract, deny only after a valid
// response failed it, none otherwise (unprotected, bypassed, every failure,
// client abort).
type Verdict uint8

const (
	VerdictNone Verdict = iota
	VerdictAllow
	VerdictDeny
)

// String is "allow", "deny" or "-" (as an access log shows a missing value).
func (v Verdict) String() string {
	switch v {
	case VerdictAllow:
		return "allow"
	case VerdictDeny:
		return "deny"
	}
	return "-"
}

// Outcome is what happened to the request at admission. The order matches
// metrics.Outcomes.
type Outcome uint8

const (
	OutcomeAllow         Outcome = iota // valid allow: admitted
	OutcomeDeny                         // valid deny: deny status
	OutcomeFailOpen                     // no valid decision, fail: open: admitted
	OutcomeFailClose                    // no valid decision, fail: close: deny status
	OutcomeFailLocal                    // no valid decision, fail: local: the local bucket decided
	OutcomeBypass                       // unprotected or unmatched: no RateLimitly request
	OutcomeShadowDeny                   // shadow mode, would have denied: admitted
	OutcomeInternalError                // internal failure: 500
	OutcomeClientAbort                  // the client went away
	OutcomeGuardProbe                   // only latency guards denied; admitted as a probe (deny.guard_probe)
	numOutcomes
)

var outcomeNames = [numOutcomes]string{
	"allow", "deny", "fail_open", "fail_close", "fail_local", "bypass", "shadow_deny", "internal_error", "client_abort", "guard_probe",
}

func (o Outcome) String() string {
	if o < numOutcomes {
		return outcomeNames[o]
	}
	return "unknown"
}

// OutcomeNames lists every outcome name in index order.
func OutcomeNames() []string { return outcomeNames[:] }

// Action is what the proxy does with the request.
type Action uint8

const (
	ActionAdmit    Action = iota // forward upstream
	ActionDeny                   // answer the deny status
	ActionLocal                  // ask the local fallback, then admit or deny
	ActionInternal               // answer 500
	ActionDrop                   // the client is gone: nothing to answer
)

func (a Action) String() string {
	return [...]string{"admit", "deny", "local", "internal", "drop"}[a]
}

// Resolve is the failure table of the contract (seed 000): from the verdict
// and cause of a check, the failure policy and shadow mode, it gives the
// outcome and the action. For ActionLocal the outcome is OutcomeFailLocal
// and the local limiter's answer decides admit or deny (LocalOutcome). A
// shadow location never rejects: whatever enforcement would have denied is
// OutcomeShadowDeny and admitted.
func Resolve(v Verdict, c ratelimitly.Cause, fail FailPolicy, shadow bool) (Outcome, Action) {
	switch {
	case v == VerdictAllow:
		return OutcomeAllow, ActionAdmit
	case v == VerdictDeny:
		if shadow {
			return OutcomeShadowDeny, ActionAdmit
		}
		return OutcomeDeny, ActionDeny
	case c == ratelimitly.CauseCancelled:
		return OutcomeClientAbort, ActionDrop
	case c == ratelimitly.CauseUnprotected || c == ratelimitly.CauseUnmatched:
		return OutcomeBypass, ActionAdmit
	case c.IsFailure():
		switch fail {
		case FailClose:
			if shadow {
				// Shadow never rejects: enforcement would have denied.
				return OutcomeShadowDeny, ActionAdmit
			}
			return OutcomeFailClose, ActionDeny
		case FailLocal:
			return OutcomeFailLocal, ActionLocal
		}
		return OutcomeFailOpen, ActionAdmit
	}
	return OutcomeInternalError, ActionInternal
}

// LocalOutcome is the outcome and action once the local fallback answered.
func LocalOutcome(allowed, shadow bool) (Outcome, Action) {
	switch {
	case allowed:
		return OutcomeFailLocal, ActionAdmit
	case shadow:
		return OutcomeShadowDeny, ActionAdmit
	}
	return OutcomeFailLocal, ActionDeny
}

// ShouldReport is the report rule: a location with `report` reports after a
// valid allow, after fail-open (or a local-fallback admit, a shadow admit
// or a guard probe: the work was performed), and for unprotected work; never after a
// deny, fail-close, internal error or a client that went away. admitted is
// whether the request was forwarded; aborted whether the client went away
// before its response ended.
func ShouldReport(hasReport bool, o Outcome, admitted, aborted bool) bool {
	if !hasReport || !admitted || aborted {
		return false
	}
	switch o {
	case OutcomeAllow, OutcomeFailOpen, OutcomeBypass, OutcomeShadowDeny, OutcomeFailLocal, OutcomeGuardProbe:
		return true
	}
	return false
}

// ReportDuration clamps a request duration (first byte of the head to the
// end of the response) to the report's 1..4294967295 ms.
func ReportDuration(d time.Duration) time.Duration {
	const max = 4294967295 * time.Millisecond
	switch {
	case d < time.Millisecond:
		return time.Millisecond
	case d > max:
		return max
	}
	return d.Truncate(time.Millisecond)
}

// ReportMs is ReportDuration in whole milliseconds.
func ReportMs(d time.Duration) uint32 { return uint32(ReportDuration(d) / time.Millisecond) }
