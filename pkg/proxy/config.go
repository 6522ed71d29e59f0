package proxy

import (
	"errors"
	"net/netip"
	"runtime"
	"time"

	"github.com/rl-tproxy/rl-tproxy/pkg/evloop"
	"github.com/rl-tproxy/rl-tproxy/pkg/exchange"
)

// Config is the proxy's whole configuration: the part every client path
// shares (exchange.Config: services, Hook, dialling, admission deadline)
// and the event loops' own settings. Update swaps it atomically.
type Config struct {
	exchange.Config
	// TunnelIdleTimeout ends an upgraded connection (101 tunnel) when no
	// byte moved either way for this long, or when a side does not take
	// the bytes written to it for this long (also the 101 and the bytes
	// queued before the tunnel starts); 0: the service's IdleTimeout.
	TunnelIdleTimeout time.Duration
	// Handoff, if set, serves connections whose first bytes are not
	// HTTP/1.x (HTTP/2, TLS, other protocols); see exchange.Handoff. nil:
	// every connection is HTTP/1.x and no detection runs.
	Handoff exchange.Handoff
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
	// loops (HTTP/2, TLS passthrough, tunnels), with addresses: New and
	// Update set exchange.Config.DialAddrs with it. It runs on a loop's
	// thread: it must not block.
	DialPrep func(fd int, dst netip.AddrPort) (after func(), err error)
}

// tunnelIdle is the idle bound of svc's upgraded connections.
func (c *Config) tunnelIdle(svc *exchange.Service) time.Duration {
	return exchange.DurationOr(c.TunnelIdleTimeout, svc.IdleTimeoutOrDefault())
}

// loops is the number of event loops EventLoops asks for.
func (c *Config) loops() int {
	if c.EventLoops > 0 {
		return c.EventLoops
	}
	return runtime.GOMAXPROCS(0)
}

// ErrClosed is returned by Serve after Shutdown.
var ErrClosed = errors.New("proxy: shut down")
