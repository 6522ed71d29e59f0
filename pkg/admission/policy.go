// Package admission owns the policy and the admission contract: it loads,
// validates and compiles the policy file (services, locations, zones,
// trackers, templates), matches a request to its location, builds the
// combined RateLimitly check and turns its result into a verdict, outcome
// and action under the failure policy. It sends nothing itself: a Checker
// does (pkg/hook adapts pkg/rlclient to it).
package admission

import (
	"crypto/sha256"
	"net/netip"
	"time"

	"github.com/rl-tproxy/rl-tproxy/pkg/proxyproto"
	"github.com/rl-tproxy/rl-tproxy/pkg/ratelimitly/credentials"
)

// Policy is a validated, compiled policy file. It is immutable after Load:
// a reload builds a new Policy and swaps it atomically.
type Policy struct {
	File        string // path as given to Load
	RateLimitly RateLimitly
	Zones       []*Zone    // in file order
	Trackers    []*Tracker // in file order
	Tiers       []*Tier    // in file order
	Services    []*Service // in file order
	RequestID   RequestID
	// Warnings are legal but risky settings (rl-tproxy check prints them,
	// run logs them), as FILE:LINE: message in file order; also a
	// world-readable credentials file (at the policy's credentials line).
	Warnings []Error

	zoneByName    map[string]*Zone
	tierByName    map[string]*Tier
	trackerByName map[string]*Tracker
	listeners     []listenerRoute
	steered       []*Service
	// sum is the digest of the exact policy and credentials bytes this
	// policy was parsed from (hasSum: set by Load/Parse), so that a
	// Reloader marks what is in force, not what is on disk later.
	sum    [sha256.Size]byte
	hasSum bool
}

type listenerRoute struct {
	addr netip.AddrPort
	svc  *Service
}

// FailPolicy says what to do when no valid decision can be obtained.
type FailPolicy uint8

const (
	FailOpen  FailPolicy = iota // admit without a decision
	FailClose                   // answer the deny status
	FailLocal                   // decide with the in-process LocalLimiter (this node only)
)

func (f FailPolicy) String() string {
	switch f {
	case FailClose:
		return "close"
	case FailLocal:
		return "local"
	}
	return "open"
}

// InvalidPolicy says what a rendered value that cannot be used (empty,
// over its limit, a tier key without a value) does to the request:
// ratelimitly.CauseInvalidValue either follows the failure policy or is a
// deny of its own.
type InvalidPolicy uint8

const (
	// InvalidInherit: a zone or tracker without `invalid` uses
	// ratelimitly.invalid; at the ratelimitly level it means InvalidFail.
	InvalidInherit InvalidPolicy = iota
	// InvalidFail follows `fail` (the contract's behaviour, the default).
	InvalidFail
	// InvalidDeny answers the deny status (outcome deny, cause
	// invalid_value) whatever `fail` says; an unreachable RateLimitly still
	// follows `fail`.
	InvalidDeny
)

func (v InvalidPolicy) String() string {
	if v == InvalidDeny {
		return "deny"
	}
	return "fail"
}

// invalidPolicy resolves v (a zone's, a tracker's, or InvalidInherit for
// the label) against ratelimitly.invalid.
func (p *Policy) invalidPolicy(v InvalidPolicy) InvalidPolicy {
	if v == InvalidInherit {
		v = p.RateLimitly.Invalid
	}
	if v == InvalidInherit {
		v = InvalidFail
	}
	return v
}

// Mode is a location's enforcement mode.
type Mode uint8

const (
	ModeEnforce Mode = iota // a deny is answered
	ModeShadow              // a deny is logged and counted as "would deny"; the request is admitted
)

func (m Mode) String() string {
	if m == ModeShadow {
		return "shadow"
	}
	return "enforce"
}

// DenyFormat is the body format of a deny answer.
type DenyFormat uint8

const (
	DenyJSON DenyFormat = iota
	DenyText
)

func (f DenyFormat) String() string {
	if f == DenyText {
		return "text"
	}
	return "json"
}

// WireMaxTTL is the largest request horizon the wire's 16-bit ttl_ms carries.
const WireMaxTTL = 65535 * time.Millisecond

// RateLimitly is the `ratelimitly` block: how to reach RateLimitly.
type RateLimitly struct {
	SRV             string // SRV name; "" when Embedded
	Embedded        bool   // run an in-process server on loopback instead of discovery
	Resolver        string // host:port; "" = /etc/resolv.conf
	ResolverTimeout time.Duration
	CredentialsFile string // resolved path ("" when embedded without a file)
	// Credentials are every key of the credentials file (an embedded server
	// accepts all of them); Credential is the one the client uses (the
	// first). With embedded and no file, a random key is generated.
	Credentials         []credentials.Credential
	Credential          credentials.Credential
	GeneratedCredential bool
	RequestPolicy       RequestPolicy
	Horizon             time.Duration // RequestPolicy.Horizon(), validated
	Fail                FailPolicy
	Invalid             InvalidPolicy // for values rendered from the request; zones and trackers may override
	Bind                netip.Addr    // source address for UDP; invalid = unspecified
	Debug               bool
}

// Zone is a named resource: a bucket template and its token-bucket limits.
type Zone struct {
	Name     string
	Bucket   *Template
	Rate     uint32 // tokens per period
	PeriodMs uint32 // 1000, 60000 or 3600000
	Burst    uint32 // capacity; 0 = Rate
	Cost     uint32 // tokens per request, default 1
	Line     int
	// Per-request values (`rate: {tier: NAME}`); nil = the static value
	// above (which is then 0).
	RateTier, BurstTier, CostTier *TierValue
	// Invalid is the zone's `invalid` (InvalidInherit when unset).
	Invalid InvalidPolicy
}

// Tracker is a named latency tracker: a service template.
type Tracker struct {
	Name    string
	Service *Template
	Line    int
	Invalid InvalidPolicy // the tracker's `invalid` (InvalidInherit when unset)
}

// Guard is a latency guard: the tracker's estimate must be at or under
// Threshold for the request to pass.
type Guard struct {
	Tracker     *Tracker
	Threshold   time.Duration
	ThresholdMs uint32
	// ThresholdTier, when set, gives the threshold per request (ms).
	ThresholdTier *TierValue
}

// ForwardHeaders says which client-address headers the proxy adds upstream.
type ForwardHeaders struct {
	XForwardedFor, XForwardedProto, Forwarded, XRealIP bool
}

// Timeouts of a service's connections.
type Timeouts struct {
	Header   time.Duration // whole request head must arrive within this
	Idle     time.Duration // keep-alive idle between requests
	Upstream time.Duration // connect + response head from the upstream
	// Admission bounds the wait for a request's (HTTP/1.x, an HTTP/2
	// stream, a TLS passthrough connection) admission decision
	// (proxy.Service.AdmissionTimeout): past it the client gets 503 (TLS:
	// a reset). Always above the request policy's horizon.
	Admission time.Duration
}

// Limits bound what a client may send.
type Limits struct {
	MaxRequestLine     int
	MaxHeaderBytes     int
	MaxHeaders         int
	MaxBodyBytes       int64 // 0 = unlimited
	MaxRequestsPerConn int   // 0 = unlimited
}

// Deny configures a deny answer.
type Deny struct {
	Status int
	Format DenyFormat
	// GRPCStatus is the grpc-status of a gRPC request's deny (8,
	// RESOURCE_EXHAUSTED, by default).
	GRPCStatus int
	// GuardRetryAfter is the Retry-After of a deny that latency guards
	// caused (whole seconds, DefaultGuardRetryAfter by default).
	GuardRetryAfter time.Duration
}

// Values of Service.EscapedSlashes.
const (
	EscapedSlashesReject = "reject" // 400 for a path holding %2F or %5C
	EscapedSlashesDecode = "decode" // match the path with them decoded
)

// RateLimitFields says which answers of a service carry the IETF
// RateLimit-Policy and RateLimit fields (ratelimit_headers).
type RateLimitFields uint8

// Values of Service.RateLimitHeaders.
const (
	// RateLimitFieldsOff: no answer carries them (ratelimit_headers: false).
	RateLimitFieldsOff RateLimitFields = iota
	// RateLimitFieldsDeny: deny answers only (ratelimit_headers: true).
	RateLimitFieldsDeny
	// RateLimitFieldsAll: deny answers and allowed responses, the latter
	// with what the decision said about the zones the request consumed
	// (ratelimit_headers: all).
	RateLimitFieldsAll
)

// String is the policy's spelling of f.
func (f RateLimitFields) String() string {
	switch f {
	case RateLimitFieldsOff:
		return "false"
	case RateLimitFieldsDeny:
		return "true"
	case RateLimitFieldsAll:
		return "all"
	}
	return "unknown"
}

// DefaultGuardRetryAfter is a guard deny's Retry-After when deny sets
// none: long enough for a few reports to reach the tracker, short
// against its 60 s window.
const DefaultGuardRetryAfter = 5 * time.Second

// Service is one proxied service: where its traffic arrives (a steered
// port or listen addresses), where it goes, and its locations.
type Service struct {
	Name     string
	Port     uint16         // steered port (0 in listener mode)
	Prefixes []netip.Prefix // steered destination prefixes; empty = any
	Listen   []netip.AddrPort
	Upstream string // host:port

	Forward          ForwardHeaders
	Timeouts         Timeouts
	Limits           Limits
	RateLimitHeaders RateLimitFields // which answers carry the IETF RateLimit fields
	SteerLoopback    bool            // steered mode: connections from the node itself are steered too
	// ClientAddress, when set, names the request's client from a
	// forwarding header of a trusted peer ({remote_addr}, the access
	// line's remote); nil: the TCP peer is the client.
	ClientAddress    *ClientAddress
	Deny             Deny
	UpstreamProtocol string // how HTTP/2 clients' streams reach the upstream: auto, http1, h2c
	EscapedSlashes   string // a path with %2F or %5C: reject (400) or decode (match decoded)
	H2               H2Limits

	// Protocols other than HTTP/1.1 on the service's port (load_protocol.go).
	TLS           TLSMode
	Opaque        OpaqueMode
	ProxyProtocol proxyproto.Version // header on every upstream connection; None = off

	// Locations in file order; the first that matches wins. A service
	// written without locations has one implicit catch-all location.
	Locations []*Location
	Line      int

	index *locIndex // built by IndexLocations (matchindex.go)
}

// Steered reports whether the service is reached through sk_lookup.
func (s *Service) Steered() bool { return s.Port != 0 }

// Location is a matched part of a service with its effective (inherited)
// admission settings.
type Location struct {
	Service *Service
	Name    string // `name`, or the index in the service's list
	Index   int
	Match   Match
	Limits  []*Zone   // effective zones (resources)
	Guards  []Guard   // effective guards
	Label   *Template // nil = no label
	Report  *Tracker  // nil = no report
	Mode    Mode
	Deny    Deny
	// GuardProbe, when set (deny.guard_probe), admits a few requests that
	// only latency guards denied, so that their reports show the tracker
	// whether the service recovered.
	GuardProbe *GuardProbe
	Line       int
}

// Protected reports whether requests at this location need an admission
// decision (at least one resource or guard). Unprotected locations may
// still report latency.
func (l *Location) Protected() bool { return len(l.Limits) > 0 || len(l.Guards) > 0 }

// Zone returns the named zone, or nil.
func (p *Policy) Zone(name string) *Zone { return p.zoneByName[name] }

// Tracker returns the named tracker, or nil.
func (p *Policy) Tracker(name string) *Tracker { return p.trackerByName[name] }

// ServiceFor returns the service that owns a connection accepted with
// local address local (the original destination), or nil. Listener-mode
// services match their listen address (an unspecified listen address
// matches any local address with its port); steered services match their
// port and, when set, a destination prefix.
func (p *Policy) ServiceFor(local netip.AddrPort) *Service {
	addr := local.Addr().Unmap()
	port := local.Port()
	for _, l := range p.listeners {
		if l.addr.Port() != port {
			continue
		}
		if l.addr.Addr() == addr || l.addr.Addr().IsUnspecified() {
			return l.svc
		}
	}
	for _, s := range p.steered {
		if s.Port != port {
			continue
		}
		if len(s.Prefixes) == 0 {
			return s
		}
		for _, pf := range s.Prefixes {
			if pf.Contains(addr) {
				return s
			}
		}
	}
	return nil
}

// Summary is a one-line description for `rl-tproxy check`.
func (p *Policy) Summary() string {
	locs, protected := 0, 0
	for _, s := range p.Services {
		for _, l := range s.Locations {
			locs++
			if l.Protected() {
				protected++
			}
		}
	}
	mode := "srv " + p.RateLimitly.SRV
	if p.RateLimitly.Embedded {
		mode = "embedded"
	}
	return plural(len(p.Services), "service") + ", " + plural(locs, "location") +
		" (" + itoa(protected) + " protected), " + plural(len(p.Zones), "zone") + ", " +
		plural(len(p.Trackers), "tracker") + "; ratelimitly " + mode + ", request policy " +
		p.RateLimitly.RequestPolicy.Name + " (horizon " + p.RateLimitly.Horizon.String() + "), fail " +
		p.RateLimitly.Fail.String()
}
