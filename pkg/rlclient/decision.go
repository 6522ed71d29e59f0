package rlclient

import (
	"errors"
	"time"

	"github.com/rl-tproxy/rl-tproxy/pkg/ratelimitly"
	"github.com/rl-tproxy/rl-tproxy/pkg/ratelimitly/wire"
)

// Cause is the project's one cause vocabulary (pkg/ratelimitly). A check
// ends with exactly one: CauseAllow or a CauseDeny* value for a valid
// answer (ratelimitly.Classify of the chosen answer), otherwise
// CauseTimeout, CauseNoEndpoints, CauseSendFailure, CauseProtocol,
// CauseCardinality, CauseConstruction or CauseCancelled.
type Cause = ratelimitly.Cause

// The causes a check can end with.
const (
	CauseAllow        = ratelimitly.CauseAllow
	CauseTimeout      = ratelimitly.CauseTimeout
	CauseNoEndpoints  = ratelimitly.CauseNoEndpoints
	CauseSendFailure  = ratelimitly.CauseSendFailure
	CauseProtocol     = ratelimitly.CauseProtocol
	CauseCardinality  = ratelimitly.CauseCardinality
	CauseConstruction = ratelimitly.CauseConstruction
	CauseCancelled    = ratelimitly.CauseCancelled
	numCauses         = ratelimitly.NumCauses
)

// CheckCauses lists every cause a check can end with, in index order.
var CheckCauses = []Cause{
	CauseAllow, ratelimitly.CauseDenyResource, ratelimitly.CauseDenyGuard, ratelimitly.CauseDenyRefused,
	CauseNoEndpoints, CauseSendFailure, CauseTimeout, CauseProtocol, CauseCardinality, CauseConstruction, CauseCancelled,
}

// Errors returned by Check, one per non-decision cause (compare with ==;
// they are preallocated so a failing Check does not allocate).
var (
	ErrTimeout      = errors.New("rlclient: no valid answer within the request horizon")
	ErrNoEndpoints  = errors.New("rlclient: no RateLimitly endpoints")
	ErrSendFailure  = errors.New("rlclient: could not send to any endpoint")
	ErrProtocol     = errors.New("rlclient: authentication or protocol failure")
	ErrCardinality  = errors.New("rlclient: response cardinality differs from the request")
	ErrConstruction = errors.New("rlclient: request construction failed")
	ErrCancelled    = errors.New("rlclient: check cancelled")
	ErrClosed       = errors.New("rlclient: client closed")
)

var causeErr = [numCauses]error{
	CauseTimeout:      ErrTimeout,
	CauseNoEndpoints:  ErrNoEndpoints,
	CauseSendFailure:  ErrSendFailure,
	CauseProtocol:     ErrProtocol,
	CauseCardinality:  ErrCardinality,
	CauseConstruction: ErrConstruction,
	CauseCancelled:    ErrCancelled,
}

// Decision is the outcome of one Check. Its slices are reused across
// checks that pass the same Decision.
type Decision struct {
	Cause       Cause
	Allow       bool   // Cause == CauseAllow (a valid answer that denies: Cause.Denied())
	ServerEpoch uint64 // server_epoch of the chosen answer
	Endpoint    string // SRV target of the chosen answer
	Attempts    int    // sends made to the endpoints (1 + replays)
	Guards      []wire.GuardResult
	Resources   []wire.ResourceResult
	// Err is the underlying error of a construction failure (nil otherwise).
	Err error
}

// Reset clears d keeping its slices' capacity.
func (d *Decision) Reset() {
	*d = Decision{Guards: d.Guards[:0], Resources: d.Resources[:0]}
}

// RetryAfter is the largest retry_after_ms of the chosen answer's
// resources (0 when none is short).
func (d *Decision) RetryAfter() time.Duration {
	var ms uint32
	for _, r := range d.Resources {
		ms = max(ms, r.RetryAfterMs)
	}
	return time.Duration(ms) * time.Millisecond
}
