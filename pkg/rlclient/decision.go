package rlclient

import (
	"errors"
	"time"

	"github.com/rl-tproxy/rl-tproxy/pkg/rlclient/wire"
)

// Cause says why a check ended. Exactly one cause is recorded per check;
// only CauseAllow and CauseDeny are decisions.
type Cause uint8

// Causes.
const (
	CauseNone         Cause = iota
	CauseAllow              // valid answer: allowed
	CauseDeny               // valid answer: denied
	CauseTimeout            // no valid answer within the horizon
	CauseNoEndpoints        // discovery has no usable membership
	CauseSendFailure        // every endpoint's datagram was refused locally
	CauseProtocol           // answers failed authentication, were malformed or not status OK
	CauseCardinality        // an answer's result arrays differ in length from the request
	CauseConstruction       // the request could not be encoded (bounds, size)
	CauseCancelled          // the caller's context ended first
	numCauses
)

var causeNames = [numCauses]string{"none", "allow", "deny", "timeout", "no_endpoints", "send_failure", "protocol", "cardinality", "construction", "cancelled"}

func (c Cause) String() string {
	if c < numCauses {
		return causeNames[c]
	}
	return "unknown"
}

// Decided reports whether the cause is a valid decision (allow or deny).
func (c Cause) Decided() bool { return c == CauseAllow || c == CauseDeny }

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
	Allow       bool   // Cause == CauseAllow
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
