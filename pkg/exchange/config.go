package exchange

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"time"
)

// Config is the configuration every client path shares: the services,
// the Hook, how upstreams are reached and the admission deadline.
// pkg/proxy's Config embeds it beside the event loops' own settings; the
// other paths get it with each handed-off connection (HandoffConn.Config).
type Config struct {
	Services []*Service
	// Hook decides admission; nil admits everything without calling a hook.
	Hook Hook
	// Dial opens upstream connections; nil uses a net.Dialer. The eBPF
	// redirect supplies a dialer whose connections bypass the steering.
	Dial func(ctx context.Context, network, addr string) (net.Conn, error)
	// DialAddrs makes DialUpstream look an upstream's host name up
	// (Resolve) and give Dial its addresses, as the event loops do when
	// they connect themselves (pkg/proxy sets it when its DialPrep is
	// set); false: a Dial gets a host name unchanged (such a dialer may
	// map names itself). Without Dial, names are always looked up.
	DialAddrs bool
	// Resolve looks up an upstream's host name (the event loops' own
	// connections and DialUpstream); nil uses net.DefaultResolver.
	Resolve func(ctx context.Context, host string) ([]netip.Addr, error)
	// ResolveTTL is how long the addresses a lookup gave are used before
	// the name is looked up again (default DefaultResolveTTL). While
	// lookups fail, the last addresses stay in use.
	ResolveTTL time.Duration
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
	// Now is the clock for timing points (Request.Start, Result's times);
	// nil: on the event loops, the loop's time for the turn
	// (evloop.Loop.Time, read once per loop turn as nginx caches its time
	// once per event-loop iteration), elsewhere time.Now.
	Now func() time.Time
	// OnReject, if set, is called when the proxy itself answers a request
	// under a rule (see Rejecter, which a Hook may implement instead; both
	// are called). For metrics; it must not block.
	OnReject func(svc *Service, remote netip.AddrPort, rule string, status int)
	// AdmissionTimeout bounds the wait for the Hook's Decision, from the
	// end of the request head: Admit's context carries it as its
	// deadline. When it passes, the admission is cancelled (Admit's
	// context ends with context.DeadlineExceeded; a proxy.AsyncHook gets
	// Cancel, at most once per Begin), the client is answered 503 with
	// Connection: close (the proxy does not know the Hook's failure
	// policy) and the request is reported to a Rejecter as
	// "admission-timeout"; Done follows once the Hook has answered after
	// all, with Result.AdmissionErr set (wrapping ErrAdmissionTimeout). A
	// Service's own AdmissionTimeout wins; 0 (or less) means
	// DefaultAdmissionTimeout. Every path applies it: an HTTP/2 stream
	// (pkg/h2proxy) is answered 503 (a gRPC request UNAVAILABLE) and only
	// that stream ends; a TLS passthrough connection (pkg/passthrough) is
	// reset without an answer and reported with status 0. Neither waits
	// for a Hook that ignores its context: Done comes when Admit returns.
	AdmissionTimeout time.Duration
}

// AdmissionTimeoutFor is the admission bound of svc's requests: svc's
// own AdmissionTimeout, else c's, else DefaultAdmissionTimeout.
func (c *Config) AdmissionTimeoutFor(svc *Service) time.Duration {
	if svc != nil && svc.AdmissionTimeout > 0 {
		return svc.AdmissionTimeout
	}
	return DurationOr(c.AdmissionTimeout, DefaultAdmissionTimeout)
}

// ReportReject tells OnReject and a Rejecter Hook (both, when set) that
// the proxy itself answered (or closed) a request or connection of svc
// under rule. It must not block, like them.
func (c *Config) ReportReject(svc *Service, remote netip.AddrPort, rule string, status int) {
	if c.OnReject != nil {
		c.OnReject(svc, remote, rule, status)
	}
	if r, ok := c.Hook.(Rejecter); ok {
		r.Reject(svc, remote, rule, status)
	}
}

// Log is c's Logger, or one that discards.
func (c *Config) Log() *slog.Logger {
	if c.Logger != nil {
		return c.Logger
	}
	return discardLogger
}

var discardLogger = slog.New(slog.DiscardHandler)

// Service returns the service called name, or nil.
func (c *Config) Service(name string) *Service {
	for _, s := range c.Services {
		if s.Name == name {
			return s
		}
	}
	return nil
}

// Validate checks the services: unique non-empty names, host:port
// upstream and listen addresses, no negative limit or timeout.
func (c *Config) Validate() error {
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
