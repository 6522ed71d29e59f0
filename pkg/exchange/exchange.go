// Package exchange is the contract of one client exchange that every
// client path shares: the HTTP/1.1 event loops (pkg/proxy), HTTP/2
// streams (pkg/h2proxy) and TLS or opaque passthrough connections
// (pkg/passthrough). It holds what the Hook sees and answers (Request,
// Decision, Result), the services and the configuration the paths share,
// the admission deadline and its one error, the forwarding and
// hop-by-hop header rules, the escaped-slash path rule, the PROXY header
// writer, the upstream dialler of the paths outside the loops, and the
// handoff of a connection from the loops to another path.
package exchange

import (
	"context"
	"net/netip"
	"time"

	"github.com/rl-tproxy/rl-tproxy/pkg/evloop"
	"github.com/rl-tproxy/rl-tproxy/pkg/httpparse"
	"github.com/rl-tproxy/rl-tproxy/pkg/proxyproto"
	"github.com/rl-tproxy/rl-tproxy/pkg/realip"
)

// Defaults applied when a Service or Config field is zero.
const (
	DefaultHeaderTimeout       = 10 * time.Second
	DefaultIdleTimeout         = 60 * time.Second
	DefaultUpstreamTimeout     = 60 * time.Second
	DefaultMaxIdlePerUpstream  = 256
	DefaultUpstreamIdleTimeout = 30 * time.Second
	// DefaultAdmissionTimeout is Config.AdmissionTimeout's default: longer
	// than the longest RateLimitly request horizon (the wire's 65535ms),
	// so that a check's own failure policy always answers first.
	DefaultAdmissionTimeout = 70 * time.Second
)

// Hook is the admission decision point. The proxy calls Admit once per
// request after the head has been parsed, before any byte goes upstream and
// before any 100 Continue. Done runs exactly once for every request that
// reached Admit, after the response ended or failed.
//
// The *Request, *Decision and *Result values are owned by the proxy and are
// reused for the next request on the same connection: a Hook must not keep
// them (or slices into them) after Done returns.
type Hook interface {
	// Admit decides. ctx is cancelled if the client goes away while Admit
	// is waiting.
	Admit(ctx context.Context, r *Request) Decision
	// Done reports the outcome of a request that reached Admit.
	Done(r *Request, d *Decision, res *Result)
}

// ContextBound is an optional interface of a Hook whose Admit returns
// promptly once its context ends (the admission deadline or the client's
// going away), whatever it then decides. The HTTP/2 path calls such a
// Hook's Admit on the stream's own goroutine; any other Hook's runs on a
// goroutine of its own, so that one that ignores its context cannot hold
// the stream past the deadline. Such an Admit must not keep its context
// after it returns (the HTTP/2 path reuses it for the stream's next
// admission). The method is a marker: it is not called.
type ContextBound interface {
	AdmitReturnsOnContextEnd()
}

// Rejecter is an optional interface of a Hook. The proxy calls Reject for
// every request it answers itself under a rule: a strictness rule (rule
// names from httpparse, 400/414/417/431/501/505), "header-timeout" (408)
// and "body-too-large" (413); also for a connection closed without an
// answer because its first bytes picked no protocol within the header
// timeout ("detect-timeout", status 0, with proxy.Config.Handoff set).
// Most of these never reach Admit; a chunked body found too large or
// malformed after admission also gets Done, and so does
// "admission-timeout" (503: no Decision within Config.AdmissionTimeout;
// status 0 for a TLS passthrough connection,
// reset without an answer). Reject runs before the answer is written, on
// the connection's loop thread (HTTP/1.x) or another goroutine (the
// HTTP/2 and passthrough paths), so it must not block; it also runs for
// requests whose Service is the only thing known (no Request is built).
type Rejecter interface {
	Reject(svc *Service, remote netip.AddrPort, rule string, status int)
}

// Request is what the Hook sees of one request.
type Request struct {
	// Remote is the client: the TCP peer, or the client a PROXY header
	// named (Service.AcceptProxy), or the client a Hook read from a
	// trusted peer's forwarding header (the policy's client_address: a
	// Hook may set Remote and Peer while it admits, before Admit returns
	// or Resume). The forwarding fields sent upstream name it
	// (ForwardField.AppendValue). Local is the original destination
	// (getsockname).
	Remote, Local netip.AddrPort
	// Peer is the TCP peer when Remote names another client; zero when
	// Remote is the peer.
	Peer        netip.AddrPort
	Service     *Service // the service that owns the listener or port
	Head        *httpparse.Request
	Path, Query []byte    // the target split at the first '?'
	Start       time.Time // arrival of the first byte of the request head
	// Proto is the protocol the client spoke (ProtoHTTP11, ProtoH2, ...),
	// set by the code path that built the Request; the access log shows it.
	Proto string
	// SNI and ALPN are set for a TLS passthrough connection (Head is nil):
	// the ClientHello's server name and the client's first ALPN protocol.
	SNI, ALPN []byte
	// Loop is the event loop that owns the request's connection (nil for
	// the HTTP/2 and passthrough paths). A proxy.AsyncHook's Begin and
	// Cancel run on its thread, so a hook can keep per-loop state there
	// (evloop's Watch, OnTurnEnd and Timer, registered on first use).
	Loop *evloop.Loop
	// HookState is opaque to the proxy, as Decision.State: a
	// proxy.AsyncHook may set it in Begin to find its pending admission
	// in Cancel without a lookup shared by every loop. The proxy never
	// reads it.
	HookState any
}

// Request.Proto values. Each protocol's path sets its own.
const (
	ProtoHTTP10         = "http/1.0"
	ProtoHTTP11         = "http/1.1"
	ProtoH2             = "h2"
	ProtoTLSPassthrough = "tls-passthrough"
)

// HeaderValue returns the first value of the named request header
// (case-insensitive). It does not allocate.
func (r *Request) HeaderValue(name string) ([]byte, bool) {
	if r.Head == nil {
		return nil, false
	}
	return r.Head.Header(name)
}

// Decision is the Hook's answer.
type Decision struct {
	Allow bool
	// Status is the deny status (429 when zero).
	Status int
	// Header holds extra response headers: the deny answer's headers, or
	// headers appended to the upstream response on allow.
	Header      []httpparse.Header
	Body        []byte
	ContentType string
	// Forward holds fields added to the request sent upstream on allow; a
	// client field with the same name is dropped (replaced).
	Forward []httpparse.Header
	// State is opaque to the proxy and handed back in Done.
	State any
}

// Result is the outcome of one request.
type Result struct {
	// Status is the status sent to the client (0 if nothing was sent).
	Status int
	// ClientAborted is true when the client went away before the response
	// completed (during admission, while sending its body, or while the
	// response was relayed).
	ClientAborted bool
	// UpstreamErr is set when the upstream failed (dial, write, read,
	// malformed response), or when the exchange was cut after the
	// upstream's response head reached the client (a request body that
	// broke a rule then: Status stays the relayed one).
	UpstreamErr error
	// AdmissionErr is set when the proxy stopped waiting for the Hook's
	// Decision (Config.AdmissionTimeout): the client was answered 503 and
	// the Decision, which came later, was not used. It is an internal
	// error, not the client's: ClientAborted stays false.
	AdmissionErr error
	// End is when the last byte of the response was written (or the
	// request failed).
	End time.Time
	// BytesIn counts request body bytes read from the client; BytesOut
	// counts response bytes written to the client (head and body).
	BytesIn, BytesOut int64
	// Upstream is the upstream address the request was sent to ("" when
	// it was not forwarded); UpstreamStatus is the final status of the
	// upstream's response head (0 when none arrived); UpstreamTTFB is the
	// time from the start of the upstream exchange (pooled connection or
	// dial) to the end of that response head.
	Upstream       string
	UpstreamStatus int
	UpstreamTTFB   time.Duration
}

// Service is one protected service: where its clients arrive and where its
// unchanged upstream listens.
type Service struct {
	Name string
	// Listen holds the listener-mode addresses (host:port) served by
	// ListenAndServe.
	Listen []string
	// Port is the steered destination port (ServeSteered picks the service
	// by the original destination port of the connection).
	Port uint16
	// Upstream is the service's own address (host:port).
	Upstream string

	// Forwarding headers added to the upstream request.
	XForwardedFor, XForwardedProto, Forwarded, XRealIP bool

	HeaderTimeout      time.Duration // first byte to end of head (408); default 10s
	IdleTimeout        time.Duration // keep-alive idle wait and body progress; default 60s
	UpstreamTimeout    time.Duration // dial, send and response head wait; default 60s
	MaxRequestsPerConn int           // 0 = unlimited
	MaxBodyBytes       int64         // 0 = unlimited; larger bodies get 413
	Limits             httpparse.Limits
	// AdmissionTimeout is Config.AdmissionTimeout for this service's
	// HTTP/1.x requests, HTTP/2 streams and TLS passthrough connections
	// (the policy's timeouts.admission); 0: the Config's. An Update
	// applies it to the requests whose head ends after it.
	AdmissionTimeout time.Duration

	// ProxyProtocol starts every upstream connection with a PROXY protocol
	// header naming the client. Such a connection serves one
	// client connection only: it is never pooled for others.
	ProxyProtocol proxyproto.Version
	// AcceptProxy, when set, reads an inbound PROXY protocol header (v1 or
	// v2) at the start of every connection from a peer inside it, and
	// requires one: the header names the client (Request.Remote; the TCP
	// peer goes to Request.Peer). A connection from any other peer that
	// starts with a PROXY header is refused, never believed. Applies to
	// every protocol on the port (HTTP/1.x, HTTP/2, TLS passthrough).
	AcceptProxy *realip.Trusted
	// TLS and Opaque say what the service does with TLS and with other
	// protocols; Handoff implementations read them.
	TLS, Opaque ConnMode

	// UpstreamProtocol is how HTTP/2 clients' streams reach the upstream
	// (pkg/h2proxy): "" or "auto" (the client's: h2c), "http1" or "h2c".
	// HTTP/1.1 clients are always forwarded as HTTP/1.1.
	UpstreamProtocol string
	// DecodeEscapedSlashes lets a request whose path holds an escaped
	// slash (%2F) or backslash (%5C) through, to be matched on its
	// decoded path; false refuses it with 400 (CheckPath).
	DecodeEscapedSlashes bool
	// H2 bounds HTTP/2 client connections (zero fields: pkg/h2proxy's
	// defaults).
	H2 H2Limits
}

// H2Limits are the HTTP/2 settings the proxy advertises and enforces.
// The header block (SETTINGS_MAX_HEADER_LIST_SIZE) is bounded by
// Limits.MaxHeaderBytes.
type H2Limits struct {
	MaxConcurrentStreams uint32 // SETTINGS_MAX_CONCURRENT_STREAMS
	MaxReadFrameSize     uint32 // SETTINGS_MAX_FRAME_SIZE
	HeaderTableSize      uint32 // SETTINGS_HEADER_TABLE_SIZE (HPACK dynamic table)
	StreamWindow         uint32 // per-stream receive window: body held before admission
}

// HeaderTimeoutOrDefault is s.HeaderTimeout, or DefaultHeaderTimeout when
// it is zero.
func (s *Service) HeaderTimeoutOrDefault() time.Duration {
	return DurationOr(s.HeaderTimeout, DefaultHeaderTimeout)
}

// IdleTimeoutOrDefault is s.IdleTimeout, or DefaultIdleTimeout when it is
// zero.
func (s *Service) IdleTimeoutOrDefault() time.Duration {
	return DurationOr(s.IdleTimeout, DefaultIdleTimeout)
}

// UpstreamTimeoutOrDefault is s.UpstreamTimeout, or
// DefaultUpstreamTimeout when it is zero.
func (s *Service) UpstreamTimeoutOrDefault() time.Duration {
	return DurationOr(s.UpstreamTimeout, DefaultUpstreamTimeout)
}

// DurationOr is d when it is above 0, else def: how every duration
// setting falls back to its default.
func DurationOr(d, def time.Duration) time.Duration {
	if d > 0 {
		return d
	}
	return def
}
