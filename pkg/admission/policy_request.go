package admission

import (
	"strconv"

	"github.com/rl-tproxy/rl-tproxy/pkg/ratelimitly"
)

// RequestPolicy is the RateLimitly request policy (fan-out, replay,
// completion) the policy file selects. It is rlclient's type, so the
// horizon formula and its validation live in one place
// (ratelimitly.RequestPolicy.Horizon and Validate).
type RequestPolicy = ratelimitly.RequestPolicy

// Request-policy names and the default unit.
const (
	PolicyStandard    = ratelimitly.PolicyStandard
	PolicySingleRound = ratelimitly.PolicySingleRound
	PolicyCustom      = ratelimitly.PolicyCustom
	DefaultUnit       = ratelimitly.DefaultUnit
	MaxReplays        = ratelimitly.MaxReplays
)

func itoa(n int) string { return strconv.Itoa(n) }

func plural(n int, what string) string {
	if n == 1 {
		return "1 " + what
	}
	return itoa(n) + " " + what + "s"
}
