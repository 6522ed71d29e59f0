package admission

import (
	"math"
	"strconv"
	"time"

	"github.com/rl-tproxy/rl-tproxy/pkg/httpparse"
	"github.com/rl-tproxy/rl-tproxy/pkg/ratelimitly/wire"
)

// Answer header names (shared, never written to).
var (
	hdrRetryAfter      = []byte("Retry-After")
	hdrRateLimitPolicy = []byte("RateLimit-Policy")
	hdrRateLimit       = []byte("RateLimit")
)

// AnswerZone is one zone of a location as the RateLimit fields show it:
// Quota units per Window (the zone's rate and period).
type AnswerZone struct {
	Name   string
	Quota  uint32
	Window time.Duration
	// Unannounced leaves the zone out of both fields: its quota differs
	// per request (a tiered rate), so there is no single value to
	// announce. It keeps its place, so that AnswerSpec.Zones stays
	// indexed like the location's zones and their decision states.
	Unannounced bool
}

// AnswerSpec configures a location's deny answer.
type AnswerSpec struct {
	Status int // 0 = 429
	// RateLimitHeaders adds the IETF httpapi RateLimit-Policy and RateLimit
	// fields (draft-ietf-httpapi-ratelimit-headers) to deny answers.
	RateLimitHeaders bool
	// RateLimitOnAllow adds them to allowed responses too (RenderAllow).
	RateLimitOnAllow bool
	JSON             bool   // JSON body instead of text
	Message          string // "" = "rate limit exceeded"
	// Zones are the location's zones, in its order (the order of a
	// decision's Zones).
	Zones []AnswerZone
	// GuardRetryAfter is the Retry-After of a deny latency guards caused
	// (rounded up to whole seconds; 0 = DefaultGuardRetryAfter).
	GuardRetryAfter time.Duration
}

// The messages of the deny bodies other than a rate-limit deny's.
const (
	GuardMessage     = "service overloaded: latency guard tripped"
	FailCloseMessage = "rate limit check failed (fail: close)"
)

// DenyAnswer is a location's deny response, and the RateLimit fields of
// its allowed responses, precomputed at policy load so that answering a
// request only formats the numbers that vary (Retry-After, remaining and
// reset per zone) into a caller buffer.
type DenyAnswer struct {
	Status      int
	ContentType string
	Body        []byte // a rate-limit deny's
	GuardBody   []byte // a guard deny's (DenyGuard)
	FailBody    []byte // a fail: close deny's (DenyFailClose)
	guardRetry  uint32 // seconds
	headers     bool   // on deny answers
	onAllow     bool   // on allowed responses
	policy      []byte // RateLimit-Policy value ("" when no zone is announced)
	// names holds, per zone of the location (indexed like a decision's
	// Zones), its sf-string `"name"`; nil for a zone left unannounced.
	names [][]byte
}

// DefaultDenyStatus is the deny status when a location sets none.
const DefaultDenyStatus = 429

// NewDenyAnswer precomputes the answer of spec.
func NewDenyAnswer(spec AnswerSpec) *DenyAnswer {
	a := &DenyAnswer{Status: spec.Status, headers: spec.RateLimitHeaders, onAllow: spec.RateLimitHeaders && spec.RateLimitOnAllow}
	if a.Status == 0 {
		a.Status = DefaultDenyStatus
	}
	msg := spec.Message
	if msg == "" {
		msg = "rate limit exceeded"
	}
	a.ContentType = "text/plain; charset=utf-8"
	if spec.JSON {
		a.ContentType = "application/json"
	}
	a.Body = denyBody(a.Status, spec.JSON, msg)
	a.GuardBody = denyBody(a.Status, spec.JSON, GuardMessage)
	a.FailBody = denyBody(a.Status, spec.JSON, FailCloseMessage)
	gr := spec.GuardRetryAfter
	if gr <= 0 {
		gr = DefaultGuardRetryAfter
	}
	a.guardRetry = uint32(max(1, (gr+time.Second-1)/time.Second))
	a.names = make([][]byte, len(spec.Zones))
	for i, z := range spec.Zones {
		if z.Unannounced {
			continue
		}
		name := appendSFString(nil, z.Name)
		a.names[i] = name
		if len(a.policy) > 0 {
			a.policy = append(a.policy, ", "...)
		}
		a.policy = append(a.policy, name...)
		a.policy = append(a.policy, ";q="...)
		a.policy = strconv.AppendUint(a.policy, uint64(z.Quota), 10)
		a.policy = append(a.policy, ";w="...)
		w := int64((z.Window + time.Second - 1) / time.Second)
		if w < 1 {
			w = 1
		}
		a.policy = strconv.AppendInt(a.policy, w, 10)
	}
	return a
}

// denyBody is a deny answer's body: JSON {"status":N,"error":msg} or the
// text line "N Reason: msg".
func denyBody(status int, json bool, msg string) []byte {
	if json {
		b := []byte(`{"status":`)
		b = strconv.AppendInt(b, int64(status), 10)
		b = append(b, `,"error":`...)
		b = strconv.AppendQuote(b, msg)
		return append(b, "}\n"...)
	}
	return []byte(strconv.Itoa(status) + " " + statusText(status) + ": " + msg + "\n")
}

func statusText(code int) string {
	switch code {
	case 429:
		return "Too Many Requests"
	case 503:
		return "Service Unavailable"
	case 403:
		return "Forbidden"
	case 500:
		return "Internal Server Error"
	}
	return "Denied"
}

// appendSFString appends s as a structured-field String (RFC 9651 §3.3.3):
// printable ASCII in quotes, `"` and `\` escaped, other bytes replaced by '_'.
func appendSFString(dst []byte, s string) []byte {
	dst = append(dst, '"')
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '"' || c == '\\':
			dst = append(dst, '\\', c)
		case c < 0x20 || c > 0x7e:
			dst = append(dst, '_')
		default:
			dst = append(dst, c)
		}
	}
	return append(dst, '"')
}

// ZoneState is what a decision says about one zone's resource.
type ZoneState struct {
	Remaining    uint32
	RetryAfterMs uint32
	Known        bool // false when no decision data exists (fail-close)
}

// RetryAfterSeconds is Retry-After in whole seconds: the largest
// retry_after_ms rounded up, at least 1.
func RetryAfterSeconds(zones []ZoneState) uint32 {
	var max uint32
	for _, z := range zones {
		if z.RetryAfterMs > max {
			max = z.RetryAfterMs
		}
	}
	s := max / 1000
	if max%1000 != 0 {
		s++
	}
	if s < 1 {
		s = 1
	}
	return s
}

// AnswerBufSize is a buffer size that holds any answer's variable values
// for up to 32 zones without growing.
const AnswerBufSize = 16 + 32*48

// Render appends the headers of a rate-limit deny (Retry-After, and the
// RateLimit fields when enabled) to hdrs, formatting values into buf;
// zones is indexed like the spec's zones (shorter when unknown). It
// allocates nothing when hdrs and buf have the capacity (3 headers,
// AnswerBufSize bytes).
func (a *DenyAnswer) Render(hdrs []httpparse.Header, buf []byte, zones []ZoneState) ([]httpparse.Header, []byte) {
	return a.render(hdrs, buf, zones, RetryAfterSeconds(zones))
}

// RenderDecision is Render for the deny d: its Retry-After is
// a.RetryAfter(d). It returns the body that tells the client what
// happened (Body, GuardBody or FailBody).
func (a *DenyAnswer) RenderDecision(hdrs []httpparse.Header, buf []byte, d *Decision) ([]httpparse.Header, []byte, []byte) {
	hdrs, buf = a.render(hdrs, buf, d.Zones, a.RetryAfter(d))
	switch d.DenyKind() {
	case DenyGuard:
		return hdrs, buf, a.GuardBody
	case DenyFailClose:
		return hdrs, buf, a.FailBody
	}
	return hdrs, buf, a.Body
}

// RetryAfter is the Retry-After (whole seconds, at least 1) of the deny
// d: the largest retry_after_ms of its zones rounded up (1 when none is
// known: fail: close, invalid: deny); when a latency guard failed, at
// least the location's deny.guard_retry_after.
func (a *DenyAnswer) RetryAfter(d *Decision) uint32 {
	s := RetryAfterSeconds(d.Zones)
	if d.GuardFailed() {
		s = max(s, a.guardRetry)
	}
	return s
}

func (a *DenyAnswer) render(hdrs []httpparse.Header, buf []byte, zones []ZoneState, retry uint32) ([]httpparse.Header, []byte) {
	start := len(buf)
	buf = strconv.AppendUint(buf, uint64(retry), 10)
	hdrs = append(hdrs, httpparse.Header{Name: hdrRetryAfter, Value: buf[start:len(buf):len(buf)]})
	if !a.headers || len(a.policy) == 0 {
		return hdrs, buf
	}
	hdrs = append(hdrs, httpparse.Header{Name: hdrRateLimitPolicy, Value: a.policy})
	short := false
	for _, z := range zones {
		short = short || z.Known && z.RetryAfterMs > 0
	}
	if !short {
		// No zone ran out (a guard deny, fail: close): remaining quota
		// would contradict the deny, so the RateLimit field is left out.
		return hdrs, buf
	}
	start = len(buf)
	n := 0
	for i, z := range zones {
		if i >= len(a.names) || a.names[i] == nil || !z.Known {
			continue
		}
		buf = a.appendItem(buf, n, i, z.Remaining, ceilSeconds(uint64(z.RetryAfterMs)))
		n++
	}
	if n > 0 {
		hdrs = append(hdrs, httpparse.Header{Name: hdrRateLimit, Value: buf[start:len(buf):len(buf)]})
	}
	return hdrs, buf
}

// appendItem appends zone i's RateLimit item `"name";r=R;t=T`, after a
// separator unless it is the field's first (n == 0).
func (a *DenyAnswer) appendItem(buf []byte, n, i int, remaining uint32, t uint64) []byte {
	if n > 0 {
		buf = append(buf, ", "...)
	}
	buf = append(buf, a.names[i]...)
	buf = append(buf, ";r="...)
	buf = strconv.AppendUint(buf, uint64(remaining), 10)
	buf = append(buf, ";t="...)
	return strconv.AppendUint(buf, t, 10)
}

func ceilSeconds(ms uint64) uint64 { return (ms + 999) / 1000 }

// RenderAllow appends the RateLimit-Policy and RateLimit fields of the
// allowed request d to hdrs when the location's service sends them on
// allowed responses (ratelimit_headers: all), formatting values into
// buf. The values are those of the decision: RateLimitly's answer for
// the zones the request consumed (or the local buckets' under
// fail: local), so no check is added. Per announced zone with a known
// state, r is what remains after the request and t the seconds until the
// zone's bucket is full again (its rendered rate, period and capacity).
// With no zone state known (fail: open) only RateLimit-Policy is added; a
// shadow location adds nothing (a dry run does not change responses). It
// allocates nothing when hdrs and buf have the capacity (2 headers,
// AnswerBufSize bytes for 32 zones of short names).
func (a *DenyAnswer) RenderAllow(hdrs []httpparse.Header, buf []byte, d *Decision) ([]httpparse.Header, []byte) {
	if !a.onAllow || len(a.policy) == 0 || d.Shadow {
		return hdrs, buf
	}
	hdrs = append(hdrs, httpparse.Header{Name: hdrRateLimitPolicy, Value: a.policy})
	start := len(buf)
	n := 0
	for i, z := range d.Zones {
		if i >= len(a.names) || a.names[i] == nil || !z.Known {
			continue
		}
		t := ceilSeconds(uint64(z.RetryAfterMs))
		if z.RetryAfterMs == 0 && i < len(d.Req.Resources) {
			t = refillSeconds(&d.Req.Resources[i], z.Remaining)
		}
		buf = a.appendItem(buf, n, i, z.Remaining, t)
		n++
	}
	if n > 0 {
		hdrs = append(hdrs, httpparse.Header{Name: hdrRateLimit, Value: buf[start:len(buf):len(buf)]})
	}
	return hdrs, buf
}

// refillSeconds is how long, in whole seconds rounded up, the bucket of
// res takes to refill from remaining tokens to its capacity (burst, or
// rate when burst is 0) at rate tokens per period.
func refillSeconds(res *wire.Resource, remaining uint32) uint64 {
	capacity := res.Burst
	if capacity == 0 {
		capacity = res.Rate
	}
	if remaining >= capacity || res.Rate == 0 {
		return 0
	}
	ms := min(math.Ceil(float64(capacity-remaining)*float64(res.PeriodMs)/float64(res.Rate)), math.MaxUint32)
	return ceilSeconds(uint64(ms))
}

// PolicyField is the precomputed RateLimit-Policy value ("" when off).
func (a *DenyAnswer) PolicyField() string {
	if !a.headers {
		return ""
	}
	return string(a.policy)
}

// LocationAnswer precomputes the deny answer of an (effective) location:
// its deny status and body format, its service's RateLimit-headers switch,
// and its zones as the RateLimit-Policy items.
func LocationAnswer(loc *Location) *DenyAnswer {
	spec := AnswerSpec{Status: loc.Deny.Status, JSON: loc.Deny.Format == DenyJSON, GuardRetryAfter: loc.Deny.GuardRetryAfter}
	if loc.Service != nil {
		spec.RateLimitHeaders = loc.Service.RateLimitHeaders != RateLimitFieldsOff
		spec.RateLimitOnAllow = loc.Service.RateLimitHeaders == RateLimitFieldsAll
	}
	for _, z := range loc.Limits {
		spec.Zones = append(spec.Zones, AnswerZone{Name: z.Name, Quota: z.Rate, Window: time.Duration(z.PeriodMs) * time.Millisecond,
			Unannounced: z.RateTier != nil}) // a tiered quota differs per request
	}
	return NewDenyAnswer(spec)
}
