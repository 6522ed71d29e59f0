package admission

import (
	"context"
	"time"

	"github.com/rl-tproxy/rl-tproxy/pkg/ratelimitly"
	"github.com/rl-tproxy/rl-tproxy/pkg/ratelimitly/wire"
)

// CheckResult is what a Checker reports for one combined check.
type CheckResult struct {
	// Valid is true when a valid, authenticated response was chosen; Resp
	// then holds it. Otherwise Fail says why there is no valid decision
	// (ratelimitly.CauseNoEndpoints, ratelimitly.CauseSendFailure, ratelimitly.CauseTimeout, ratelimitly.CauseProtocol,
	// ratelimitly.CauseCardinality, ratelimitly.CauseConstruction or ratelimitly.CauseCancelled).
	Valid bool
	Fail  ratelimitly.Cause
	Resp  wire.RateResponse
}

// Checker sends the combined check to RateLimitly and sends latency
// reports. Check must not retain req after it returns; Report must copy
// service before returning and never block.
type Checker interface {
	Check(ctx context.Context, req *wire.RateRequest, out *CheckResult)
	Report(service []byte, d time.Duration)
}

// Classify applies the allow contract (ratelimitly.Classify) and gives
// the verdict that goes with it.
func Classify(resp *wire.RateResponse, nGuards, nResources int) (Verdict, ratelimitly.Cause) {
	c := ratelimitly.Classify(resp, nGuards, nResources)
	return VerdictOf(c), c
}

// VerdictOf is the verdict a cause carries: allow, deny, or none for every
// cause that is not a valid decision.
func VerdictOf(c ratelimitly.Cause) Verdict {
	switch {
	case c == ratelimitly.CauseAllow:
		return VerdictAllow
	case c.Denied():
		return VerdictDeny
	}
	return VerdictNone
}

// Decision is the admission state of one request. Callers pool and reuse
// it (Reset) so that deciding does not allocate in steady state.
type Decision struct {
	Location *Location // nil when unmatched
	Verdict  Verdict
	Outcome  Outcome
	Cause    ratelimitly.Cause
	Action   Action
	Shadow   bool
	// Local is set when the local fallback decided (fail: local) and
	// LocalAllowed is its answer.
	Local, LocalAllowed bool
	// Admission is the time spent deciding (render, check, local fallback).
	Admission time.Duration
	// Zones is what the decision says about each resource, indexed like
	// the location's Limits (the RateLimit fields of answers); unknown
	// when no valid answer came and no local bucket decided.
	Zones  []ZoneState
	Req    wire.RateRequest
	Result CheckResult

	local []LocalZone
	buf   []byte
	// invalidBy is the `invalid` of the zone or tracker whose value could
	// not be rendered (InvalidInherit for the label).
	invalidBy InvalidPolicy
	// start is when deciding began (Engine.Begin; Admission counts from it).
	start time.Time
}

// Reset empties d keeping its buffers.
func (d *Decision) Reset() {
	d.Location = nil
	d.Verdict, d.Outcome, d.Cause, d.Action, d.Shadow = VerdictNone, OutcomeBypass, ratelimitly.CauseUnmatched, ActionAdmit, false
	d.Local, d.LocalAllowed = false, false
	d.Admission = 0
	d.Zones = d.Zones[:0]
	d.Req.Reset()
	d.Result.Valid, d.Result.Fail = false, 0
	d.Result.Resp.Reset()
	d.local = d.local[:0]
	d.buf = d.buf[:0]
	d.invalidBy = InvalidInherit
}

// ShadowBucketPrefix starts the name of every bucket a shadow-mode
// location checks: "<prefix><rendered bucket>", with the zone's rate,
// burst and cost. A dry run thus spends tokens of its own buckets, never
// those that enforced locations sharing the zone spend, and its "would
// deny" still says what enforcing the location alone would do. The
// 1024-byte bucket limit applies to the whole name. A zone's bucket
// template may not start with it (a load error).
const ShadowBucketPrefix = "~shadow/"

// renderBufSize holds every rendered value of a request that can fit a
// datagram, so rendering does not grow the buffer in practice.
const renderBufSize = 2048

// Build renders every zone, guard and label template of loc for r into
// d.Req (one combined check), with the numbers of tiered zones and guards
// looked up for r. It returns ratelimitly.CauseInvalidValue when a rendered
// value is empty or too long, or a tier has no value for r's key, ratelimitly.CauseConstruction when the request cannot
// be encoded into one datagram, and ratelimitly.CauseAllow (meaning "built") otherwise.
// It allocates nothing once d's buffers have grown.
func Build(loc *Location, r *Request, d *Decision) ratelimitly.Cause {
	if cap(d.buf) < renderBufSize {
		d.buf = make([]byte, 0, renderBufSize)
	}
	var err error
	if loc.Label != nil {
		start := len(d.buf)
		d.buf, err = loc.Label.Render(d.buf, r)
		if err != nil || len(d.buf)-start > MaxLabelLen {
			return ratelimitly.CauseInvalidValue
		}
		if len(d.buf) > start {
			d.Req.Label = d.buf[start:len(d.buf):len(d.buf)]
		}
	}
	for i := range loc.Guards {
		g := &loc.Guards[i]
		start := len(d.buf)
		d.buf, err = g.Tracker.Service.Render(d.buf, r)
		n := len(d.buf) - start
		if err != nil || n == 0 || n > MaxBucketLen {
			d.invalidBy = g.Tracker.Invalid
			return ratelimitly.CauseInvalidValue
		}
		threshold := g.ThresholdMs
		if g.ThresholdTier != nil {
			var v tierNum
			var ok bool
			if d.buf, v, ok = g.ThresholdTier.lookup(d.buf, r); !ok {
				d.invalidBy = g.Tracker.Invalid
				return ratelimitly.CauseInvalidValue
			}
			threshold = v.n
		}
		d.Req.Guards = append(d.Req.Guards, wire.Guard{Service: d.buf[start:len(d.buf):len(d.buf)], ThresholdMs: threshold})
	}
	shadow := loc.Mode == ModeShadow
	for _, z := range loc.Limits {
		start := len(d.buf)
		if shadow {
			d.buf = append(d.buf, ShadowBucketPrefix...)
		}
		d.buf, err = z.Bucket.Render(d.buf, r)
		n := len(d.buf) - start
		if err != nil || n == 0 || n > MaxBucketLen {
			d.invalidBy = z.Invalid
			return ratelimitly.CauseInvalidValue
		}
		b := d.buf[start:len(d.buf):len(d.buf)]
		rate, period, burst, cost := z.Rate, z.PeriodMs, z.Burst, z.Cost
		if z.Tiered() {
			var ok bool
			if d.buf, rate, period, burst, cost, ok = z.numbers(d.buf, r); !ok {
				d.invalidBy = z.Invalid
				return ratelimitly.CauseInvalidValue
			}
		}
		d.Req.Resources = append(d.Req.Resources, wire.Resource{Bucket: b, Rate: rate, PeriodMs: period, Burst: burst, Cost: cost})
		d.local = append(d.local, LocalZone{Zone: z.Name, Bucket: b, Rate: rate, PeriodMs: period, Burst: burst, Cost: cost})
	}
	if len(d.Req.Guards) == 0 && len(d.Req.Resources) == 0 {
		return ratelimitly.CauseConstruction
	}
	if d.Req.Validate() != nil || d.Req.EncodedLen() > wire.MaxBody {
		return ratelimitly.CauseConstruction
	}
	return ratelimitly.CauseAllow
}

// Engine decides requests: match, build, check, classify, failure policy,
// local fallback.
type Engine struct {
	Checker Checker
	Local   *LocalLimiter // used by fail: local
	Now     func() time.Time
}

// Decide fills d for r under policy p with service svc (nil = none). It
// never blocks other requests; ctx cancels the check (client gone). It is
// Begin, the check, and End.
func (e *Engine) Decide(ctx context.Context, p *Policy, svc *Service, r *Request, d *Decision) {
	if e.Begin(p, svc, r, d) {
		return
	}
	e.Checker.Check(ctx, &d.Req, &d.Result)
	e.End(p, d, ctx.Err() != nil)
}

// Begin runs the part of Decide that needs no answer from RateLimitly:
// match, build, and the failure policy of a request that cannot be built.
// It returns true when d is decided. Otherwise d.Req holds the combined
// check: the caller runs it into d.Result (Checker.Check, or a check that
// completes later) and then calls End. Begin never blocks.
func (e *Engine) Begin(p *Policy, svc *Service, r *Request, d *Decision) bool {
	d.Reset()
	if svc == nil {
		return true // unmatched: bypass
	}
	loc := svc.Match(r)
	d.Location = loc
	if loc == nil {
		return true
	}
	if !loc.Protected() {
		d.Cause = ratelimitly.CauseUnprotected
		return true
	}
	d.Shadow = loc.Mode == ModeShadow
	d.start = e.now()
	if c := Build(loc, r, d); c != ratelimitly.CauseAllow {
		d.Cause = c
		if len(d.local) != len(loc.Limits) {
			// A zone's bucket could not be rendered: there is no key to
			// limit locally either, so fail: local admits like open.
			d.local = d.local[:0]
		}
		e.resolve(p, d)
		return true
	}
	return false
}

// End finishes a decision that Begin left to the check, once d.Result
// holds the check's outcome; cancelled says that the client went away
// while the check ran.
func (e *Engine) End(p *Policy, d *Decision, cancelled bool) {
	switch {
	case d.Result.Valid:
		d.Verdict, d.Cause = Classify(&d.Result.Resp, len(d.Req.Guards), len(d.Req.Resources))
	case d.Result.Fail == ratelimitly.CauseAllow:
		d.Cause = ratelimitly.CauseInternal // a checker must say why it has no decision
	default:
		d.Cause = d.Result.Fail
	}
	if cancelled && d.Verdict == VerdictNone {
		d.Cause = ratelimitly.CauseCancelled
	}
	e.resolve(p, d)
}

func (e *Engine) now() time.Time {
	if e.Now == nil {
		return time.Now()
	}
	return e.Now()
}

// since is the time elapsed from t: with the real clock from its monotonic
// reading alone (time.Since reads one clock where time.Now reads two).
func (e *Engine) since(t time.Time) time.Duration {
	if e.Now == nil {
		return time.Since(t)
	}
	return e.Now().Sub(t)
}

// resolve applies the failure policy, the invalid-value rule and the local
// fallback to a protected request's verdict and cause.
func (e *Engine) resolve(p *Policy, d *Decision) {
	loc := d.Location
	d.Outcome, d.Action = Resolve(d.Verdict, d.Cause, p.RateLimitly.Fail, d.Shadow)
	if d.Cause == ratelimitly.CauseInvalidValue && p.invalidPolicy(d.invalidBy) == InvalidDeny {
		// A value the client controls cannot switch limits off: deny,
		// whatever `fail` (which is for an unreachable RateLimitly) says.
		d.Outcome, d.Action = OutcomeDeny, ActionDeny
		if d.Shadow {
			d.Outcome, d.Action = OutcomeShadowDeny, ActionAdmit
		}
	}
	switch {
	case d.Action == ActionLocal:
		d.Zones = grow(d.Zones, len(d.local))
		allowed := true
		if len(d.local) > 0 && e.Local != nil {
			allowed = e.Local.Take(d.local, d.Zones)
		}
		d.Local, d.LocalAllowed = true, allowed
		d.Outcome, d.Action = LocalOutcome(allowed, d.Shadow)
	case d.Verdict != VerdictNone && d.Result.Valid:
		// A decision's answer for every zone: the deny answer's RateLimit
		// field, and an allowed response's (ratelimit_headers: all).
		d.Zones = grow(d.Zones, len(d.Result.Resp.Resources))
		for i, rr := range d.Result.Resp.Resources {
			d.Zones[i] = ZoneState{Remaining: rr.Remaining, RetryAfterMs: rr.RetryAfterMs, Known: true}
		}
		if d.Verdict == VerdictDeny && d.Action == ActionDeny && loc.GuardProbe != nil && d.DenyKind() == DenyGuard && loc.GuardProbe.Take(e.now()) {
			d.Outcome, d.Action = OutcomeGuardProbe, ActionAdmit
		}
	default:
		d.Zones = grow(d.Zones, len(loc.Limits))
	}
	d.Admission = e.since(d.start)
}

// DenyKind says what a deny is, for the answer that tells the client.
type DenyKind uint8

const (
	// DenyRateLimit: a zone was short (RateLimitly's answer, or the local
	// buckets under fail: local), or a rendered value was invalid under
	// invalid: deny.
	DenyRateLimit DenyKind = iota
	// DenyGuard: RateLimitly denied because latency guards failed, and
	// no zone was short: a load shed.
	DenyGuard
	// DenyFailClose: there was no valid decision and fail: close denied.
	DenyFailClose
)

// DenyKind classifies d's deny (meaningful when d.Action is ActionDeny).
func (d *Decision) DenyKind() DenyKind {
	if d.Outcome == OutcomeFailClose {
		return DenyFailClose
	}
	if !d.Result.Valid || d.Verdict != VerdictDeny {
		return DenyRateLimit
	}
	guard := false
	for _, g := range d.Result.Resp.Guards {
		guard = guard || !g.Passed
	}
	if !guard {
		return DenyRateLimit
	}
	for _, rr := range d.Result.Resp.Resources {
		if rr.TokensDeficit > 0 {
			return DenyRateLimit
		}
	}
	return DenyGuard
}

// GuardFailed reports whether a valid deny had a latency guard fail
// (alone or with short zones).
func (d *Decision) GuardFailed() bool {
	if !d.Result.Valid || d.Verdict != VerdictDeny {
		return false
	}
	for _, g := range d.Result.Resp.Guards {
		if !g.Passed {
			return true
		}
	}
	return false
}

func grow(z []ZoneState, n int) []ZoneState {
	if cap(z) < n {
		z = make([]ZoneState, n)
	}
	z = z[:n]
	clear(z)
	return z
}
