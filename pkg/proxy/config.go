package proxy

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"runtime"
	"time"

	"github.com/rl-tproxy/rl-tproxy/pkg/evloop"
	"github.com/rl-tproxy/rl-tproxy/pkg/httpparse"
	"github.com/rl-tproxy/rl-tproxy/pkg/proxyproto"
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
// timeout ("detect-timeout", status 0, with Config.Handoff set). Most of these never reach Admit; a chunked
// body found too large or malformed after admission also gets Done, and
// so does "admission-timeout" (503: no Decision within
// Config.AdmissionTimeout; status 0 for a TLS passthrough connection,
// reset without an answer). Reject runs before the answer is written, on
// the connection's loop thread (HTTP/1.x) or another goroutine (the
// HTTP/2 and passthrough paths), so it must not block; it also runs for
// requests whose Service is the only thing known (no Request is built).
type Rejecter interface {
	Reject(svc *Service, remote netip.AddrPort, rule string, status int)
}

// Request is what the Hook sees of one request.
type Request struct {
	Remote, Local netip.AddrPort // Local is the original destination (getsockname)
	Service       *Service       // the service that owns the listener or port
	Head          *httpparse.Request
	Path, Query   []byte    // the target split at the first '?'
	Start         time.Time // arrival of the first byte of the request head
	// Proto is the protocol the client spoke (ProtoHTTP11, ProtoH2, ...),
	// set by the code path that built the Request; the access log shows it.
	Proto string
	// SNI and ALPN are set for a TLS passthrough connection (Head is nil):
	// the ClientHello's server name and the client's first ALPN protocol.
	SNI, ALPN []byte
	// Loop is the event loop that owns the request's connection (nil for
	// the HTTP/2 and passthrough paths). An AsyncHook's Begin and Cancel run on its
	// thread, so a hook can keep per-loop state there (evloop's Watch,
	// OnTurnEnd and Timer, registered on first use).
	Loop *evloop.Loop
	// HookState is opaque to the proxy, as Decision.State: an AsyncHook
	// may set it in Begin to find its pending admission in Cancel
	// without a lookup shared by every loop. The proxy never reads it.
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
	upStart        time.Time
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
	// header naming the client (pinned.go). Such a connection serves one
	// client connection only: it is never pooled for others.
	ProxyProtocol proxyproto.Version
	// TLS and Opaque say what the service does with TLS and with other
	// protocols; Handoff implementations read them (handoff.go).
	TLS, Opaque ConnMode

	// UpstreamProtocol is how HTTP/2 clients' streams reach the upstream
	// (pkg/h2proxy): "" or "auto" (the client's: h2c), "http1" or "h2c".
	// HTTP/1.1 clients are always forwarded as HTTP/1.1.
	UpstreamProtocol string
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

func (s *Service) headerTimeout() time.Duration { return durOr(s.HeaderTimeout, DefaultHeaderTimeout) }
func (s *Service) idleTimeout() time.Duration   { return durOr(s.IdleTimeout, DefaultIdleTimeout) }
func (s *Service) upstreamTimeout() time.Duration {
	return durOr(s.UpstreamTimeout, DefaultUpstreamTimeout)
}

func durOr(d, def time.Duration) time.Duration {
	if d > 0 {
		return d
	}
	return def
}

// Config is the proxy's whole configuration. Update swaps it atomically.
type Config struct {
	Services []*Service
	// Hook decides admission; nil admits everything without calling a hook.
	Hook Hook
	// Dial opens upstream connections; nil uses a net.Dialer. The eBPF
	// redirect supplies a dialer whose connections bypass the steering.
	Dial func(ctx context.Context, network, addr string) (net.Conn, error)
	// Logger receives protocol errors (the rule that rejected a request)
	// and upstream failures at debug level (the Hook's Done sees both for
	// access logs), accept errors at warn; nil discards.
	Logger *slog.Logger
	// MaxIdlePerUpstream bounds the idle pooled connections per upstream
	// address (default 256; negative disables pooling).
	MaxIdlePerUpstream int
	// UpstreamIdleTimeout closes pooled connections idle this long
	// (default 30s).
	UpstreamIdleTimeout time.Duration
	// TunnelIdleTimeout ends an upgraded connection (101 tunnel) when no
	// byte moved either way for this long, or when a side does not take
	// the bytes written to it for this long (also the 101 and the bytes
	// queued before the tunnel starts); 0: the service's IdleTimeout.
	TunnelIdleTimeout time.Duration
	// Handoff, if set, serves connections whose first bytes are not
	// HTTP/1.x (HTTP/2, TLS, other protocols); see Handoff. nil: every
	// connection is HTTP/1.x and no detection runs.
	Handoff Handoff
	// Now is the clock for timing points (Request.Start, Result's times);
	// nil: the event loop's time for the turn (evloop.Loop.Time), read
	// once per loop turn as nginx caches its time once per event-loop
	// iteration.
	Now func() time.Time
	// OnReject, if set, is called when the proxy itself answers a request
	// under a rule (see Rejecter, which a Hook may implement instead; both
	// are called). For metrics; it must not block.
	OnReject func(svc *Service, remote netip.AddrPort, rule string, status int)
	// EventLoops is the number of event loops (pkg/evloop; loop.go), one
	// OS thread each, that serve the HTTP/1.x connections; 0 (or less)
	// means one per CPU the runtime uses (runtime.GOMAXPROCS). New reads
	// it; Update keeps the loops the Proxy was created with. The loops
	// start with the first Serve and stop in Shutdown.
	EventLoops int
	// SpliceMin: a Content-Length body, request or response, with at
	// least this many bytes left to relay (and a close-delimited response
	// once this many went) goes from one socket to the other by
	// splice(2), inside the kernel (loopsplice.go); 0 means
	// DefaultSpliceMin, negative never.
	SpliceMin int64
	// AdmissionTimeout bounds the wait for the Hook's Decision, from the
	// end of the request head: a blocking Hook's Admit context carries
	// it as its deadline. When it passes, the admission is cancelled
	// (Admit's context ends with context.DeadlineExceeded; an AsyncHook
	// gets Cancel, at most once per Begin), the client is answered 503
	// with Connection: close (the proxy does not know the Hook's failure
	// policy) and the request is reported to a Rejecter as
	// "admission-timeout"; Done follows once the Hook has answered after
	// all, with Result.AdmissionErr set. A Service's own AdmissionTimeout
	// wins; 0 (or less) means DefaultAdmissionTimeout. Every path applies
	// it: an HTTP/2 stream (pkg/h2proxy) is answered 503 (a gRPC request
	// UNAVAILABLE) and only that stream ends; a TLS passthrough
	// connection (pkg/passthrough) is reset without an answer and
	// reported with status 0. Neither waits for a Hook that ignores its
	// context: Done comes when Admit returns.
	AdmissionTimeout time.Duration
	// HoldP, when set and true, says that nothing the Hook's admissions
	// wait for runs on a goroutine of its own (its checks are answered on
	// the event loops, as rl-tproxy's RateLimitly client attached to them
	// is). Then an idle io_uring loop waits for its next turn inside the
	// system call, holding its P, for up to 1 ms after each park, while no
	// connection is served by a goroutine (HTTP/2, TLS, an Upgrade tunnel)
	// and no blocking Hook call or upstream dial is in progress: one
	// system call and one sleep per wait instead of the netpoller's park
	// and two thread hand-offs (evloop.Config.HoldP; docs/bench/evloop.md).
	// Other goroutines (timers, the admin listener, the garbage collector)
	// then wait up to that millisecond for a P. Called before every wait,
	// so it must be cheap.
	HoldP func() bool
	// LoopBackend is the event loops' kernel interface (evloop.Auto,
	// the zero value: io_uring, or epoll when the kernel or a seccomp
	// profile refuses io_uring; `rl-tproxy run --loop-backend`).
	LoopBackend evloop.Backend
	// HoldPInFlight, when above 0, keeps HoldP's kernel wait to loops with
	// at most that many requests in progress (a head begun until its
	// response is done): one request at a time every wait is a round trip
	// the client waits for, while under load the netpoller's slower
	// wake-up lets a turn take more completions at once, which measured
	// cheaper with admission (docs/bench/evloop.md).
	HoldPInFlight int
	// DialPrep, with Dial, lets the event loops open connections to
	// upstreams named by IP address themselves (non-blocking, no
	// goroutine): it is called on the loop with the new socket before its
	// connect (to bind it, say) and returns a function the loop runs once
	// that connect attempt finished, connected or not. The loops connect
	// to upstreams named by host name the same way, once Resolve gave
	// their addresses; Dial is then used only by the paths outside the
	// loops (HTTP/2, TLS passthrough, tunnels). It runs on a loop's
	// thread: it must not block.
	DialPrep func(fd int, dst netip.AddrPort) (after func(), err error)
	// Resolve looks up an upstream's host name for the event loops (when
	// they connect themselves: Dial nil, or DialPrep set); nil uses
	// net.DefaultResolver. It runs on a goroutine, bounded by the
	// service's upstream timeout.
	Resolve func(ctx context.Context, host string) ([]netip.Addr, error)
	// ResolveTTL is how long a loop connects to the addresses a lookup
	// gave before it looks the name up again (default DefaultResolveTTL).
	// While lookups fail, the last addresses stay in use.
	ResolveTTL time.Duration
}

// AdmissionTimeoutFor is the admission bound of svc's requests: svc's
// own AdmissionTimeout, else c's, else DefaultAdmissionTimeout. For the
// paths outside this package (HTTP/2, passthrough).
func (c *Config) AdmissionTimeoutFor(svc *Service) time.Duration { return c.admissionTimeout(svc) }

// ReportReject tells OnReject and a Rejecter Hook that the proxy itself
// answered (or closed) a request of svc under rule; for the paths outside
// this package. It must not block, like them.
func (c *Config) ReportReject(svc *Service, remote netip.AddrPort, rule string, status int) {
	reportReject(c, svc, remote, rule, status)
}

// admissionTimeout is the admission bound of svc's requests.
func (c *Config) admissionTimeout(svc *Service) time.Duration {
	if svc != nil && svc.AdmissionTimeout > 0 {
		return svc.AdmissionTimeout
	}
	return durOr(c.AdmissionTimeout, DefaultAdmissionTimeout)
}

// tunnelIdle is the idle bound of svc's upgraded connections.
func (c *Config) tunnelIdle(svc *Service) time.Duration {
	return durOr(c.TunnelIdleTimeout, svc.idleTimeout())
}

// loops is the number of event loops EventLoops asks for.
func (c *Config) loops() int {
	if c.EventLoops > 0 {
		return c.EventLoops
	}
	return runtime.GOMAXPROCS(0)
}

func (c *Config) validate() error {
	names := map[string]bool{}
	for i, s := range c.Services {
		if s == nil {
			return fmt.Errorf("service %d: nil", i)
		}
		if s.Name == "" {
			return fmt.Errorf("service %d: empty name", i)
		}
		if names[s.Name] {
			return fmt.Errorf("service %q: duplicate name", s.Name)
		}
		names[s.Name] = true
		if _, _, err := net.SplitHostPort(s.Upstream); err != nil {
			return fmt.Errorf("service %q: upstream %q: %w", s.Name, s.Upstream, err)
		}
		for _, l := range s.Listen {
			if _, _, err := net.SplitHostPort(l); err != nil {
				return fmt.Errorf("service %q: listen %q: %w", s.Name, l, err)
			}
		}
		if s.MaxBodyBytes < 0 || s.MaxRequestsPerConn < 0 {
			return fmt.Errorf("service %q: negative limit", s.Name)
		}
		if s.AdmissionTimeout < 0 {
			return fmt.Errorf("service %q: negative admission timeout %v", s.Name, s.AdmissionTimeout)
		}
	}
	return nil
}

// ErrClosed is returned by Serve after Shutdown.
var ErrClosed = errors.New("proxy: shut down")
