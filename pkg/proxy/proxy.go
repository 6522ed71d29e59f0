// Package proxy is the HTTP/1.1 data path: it accepts client connections,
// reads and strictly parses request heads, asks an admission Hook, answers
// denies, forwards admitted requests to a pooled upstream connection and
// relays the responses, with timeouts, keep-alive, pipelining, upgrades and
// graceful drain.
//
// Behaviour worth knowing:
//   - A head the parser rejects is answered with the rule's status
//     (400/414/417/431/501/505) and the connection closes; Admit never
//     sees it (Config.OnReject and a Hook's Rejecter method do). 408 after Service.HeaderTimeout from
//     the first byte; 413 above Service.MaxBodyBytes.
//   - The upstream always gets a re-serialised HTTP/1.1 head: hop-by-hop
//     fields and fields named in Connection are dropped (but Connection
//     cannot remove Host or the framing fields), one Host (the authority
//     of an absolute-form target, sent in origin form, else the Host
//     field: the host the Hook saw) and one framing field (Content-Length
//     or chunked, re-encoded by the proxy) are written, forwarding fields
//     are added per Service. Chunk extensions and trailers are not
//     forwarded.
//   - Expect: 100-continue is answered by the proxy itself, only after the
//     Hook allowed and an upstream connection is ready; Expect is not
//     forwarded (a 100 from the upstream is then dropped). A deny never
//     sends 100 and closes unless the whole body was already received.
//   - After a deny the connection stays open when the request body was
//     fully read (or absent); otherwise it closes gracefully.
//   - HTTP/1.0 clients get Connection: close; a close-delimited upstream
//     response closes the client connection too.
//   - Upgrade requests are admitted once (Upgrade: h2c excepted: it is
//     forwarded as a plain request, h2c.go); on 101 bytes are relayed both
//     ways until both directions end (after one side ends, the other gets
//     a bounded grace period).
//   - An upstream connection is pooled, and later reused, only when it has
//     no unread bytes and was not closed. A pooled connection stays
//     registered with its loop, so bytes or an EOF arriving while it idles
//     discard it at once. Bytes the response's framing does not account
//     for (after a complete response, a body after HEAD/204/304, an early
//     second response) poison it: it is closed, and no later client sees
//     them.
//   - A pooled upstream connection that fails before any response byte is
//     retried once on a fresh connection, only for idempotent requests
//     without a body.
//   - With a Hook, a client that goes away is noticed during admission
//     and until its response is completely written: Result.ClientAborted
//     is set, an AsyncHook's admission is cancelled (Cancel) and an
//     upstream exchange in progress is cancelled (its connection closed,
//     not pooled). A reset or a failed write is an abort; a FIN is one
//     only during admission (after it, a client that merely shut down its
//     write side still gets the response).
//   - Connections are served by event loops (Config.EventLoops, one per
//     CPU by default; pkg/evloop, loop.go): each loop is one OS thread
//     that owns its client connections, its upstream pools
//     (MaxIdlePerUpstream per loop and address) and its buffers. An idle
//     keep-alive connection holds neither a goroutine nor a buffer. An
//     AsyncHook admits on the loop's thread; a blocking Hook's Admit runs
//     on a worker goroutine whose Decision is posted back to the loop. An
//     upgraded or handed-off connection leaves its loop for a goroutine.
//     Attach gives every loop, on its thread, to a LoopAttacher (the
//     RateLimitly client's per-loop shard): an AsyncHook whose answer
//     is read on the request's loop resumes it there (LoopResumer).
//   - Idle upstream connections close after UpstreamIdleTimeout; a
//     loop's pool for an upstream address (with a host name's looked-up
//     addresses) is dropped a minute after its last connection closed, so
//     upstreams a reload stopped naming do not pile up; idle admission
//     workers exit after 10 s.
//   - Shutdown (graceful drain) closes idle keep-alive connections at
//     once, but waits for the first request of a just-accepted connection
//     for up to Service.HeaderTimeout after its accept; that request is
//     served with Connection: close.
//   - Update swaps the configuration for new requests; a request keeps the
//     configuration it started with.
//   - A listen address is normally a SO_REUSEPORT group of sockets
//     (ListenGroup, one per event loop), across which the kernel spreads
//     connections; ServeGroup, ServeSteeredGroup and ServeAll serve every
//     socket of a group, each loop accepting on a socket of its own
//     (group.go).
package proxy

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"

	"github.com/rl-tproxy/rl-tproxy/pkg/evloop"
	"github.com/rl-tproxy/rl-tproxy/pkg/exchange"
)

// Proxy serves HTTP/1.1 clients on any number of listeners.
type Proxy struct {
	cfg atomic.Pointer[Config]

	mu        sync.Mutex
	listeners map[net.Listener]struct{}
	shutdown  atomic.Bool
	drain     chan struct{}  // closed when Shutdown begins (HandoffConn.Drain)
	wg        sync.WaitGroup // Serve goroutines

	discarded atomic.Uint64 // Stats.UpstreamDiscarded
	// Stats.UpstreamLookups, UpstreamLookupErrors
	lookups, lookupErrs atomic.Uint64
	lg                  *loopGroup // the event loops
}

// New validates cfg and returns a Proxy. Nothing listens until Serve,
// ServeSteered or ListenAndServe.
func New(cfg Config) (*Proxy, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("proxy config: %w", err)
	}
	p := &Proxy{
		listeners: map[net.Listener]struct{}{},
		drain:     make(chan struct{}),
	}
	c := cfg
	c.DialAddrs = c.DialAddrs || c.DialPrep != nil
	p.lg = newLoopGroup(p, c.loops())
	p.cfg.Store(&c)
	return p, nil
}

// Update swaps the configuration for new requests. Requests already past
// their head keep the configuration (service, hook, timeouts) they started
// with. Listener addresses are not reopened: a changed Listen list needs
// new Serve calls by the caller.
func (p *Proxy) Update(cfg Config) error {
	if err := cfg.Validate(); err != nil {
		return fmt.Errorf("proxy config: %w", err)
	}
	c := cfg
	c.DialAddrs = c.DialAddrs || c.DialPrep != nil
	p.cfg.Store(&c)
	return nil
}

// Config returns the current configuration.
func (p *Proxy) Config() *Config { return p.cfg.Load() }

// Serve accepts connections on ln for svc until ln fails or Shutdown. After
// Update, requests use the service of the same name in the new
// configuration (or svc if that name is gone).
func (p *Proxy) Serve(ln net.Listener, svc *exchange.Service) error {
	if svc == nil {
		return errors.New("proxy: Serve with nil service")
	}
	return p.serve(ln, pickNamed(svc))
}

// pickNamed picks the current configuration's service named like svc (or
// svc once that name is gone).
func pickNamed(svc *exchange.Service) func(*Config, netip.AddrPort) *exchange.Service {
	name := svc.Name
	return func(cfg *Config, _ netip.AddrPort) *exchange.Service {
		if s := cfg.Service(name); s != nil {
			return s
		}
		return svc
	}
}

// ServeSteered accepts connections on a listener that receives steered
// connections for many ports; pick maps the original destination to its
// service (nil pick: the current configuration's service whose Port equals
// the destination port). Connections whose destination has no service are
// closed.
func (p *Proxy) ServeSteered(ln net.Listener, pick func(cfg *Config, local netip.AddrPort) *exchange.Service) error {
	if pick == nil {
		pick = pickByPort
	}
	return p.serve(ln, pick)
}

// pickByPort picks the service whose Port is the destination port.
func pickByPort(cfg *Config, local netip.AddrPort) *exchange.Service {
	for _, s := range cfg.Services {
		if s.Port != 0 && s.Port == local.Port() {
			return s
		}
	}
	return nil
}

// ListenAndServe opens every Services[].Listen address (MPTCP off) and
// serves them until Shutdown; see ListenAll and ServeAll.
func (p *Proxy) ListenAndServe() error {
	lns, err := p.ListenAll(context.Background())
	if err != nil {
		return err
	}
	return p.ServeAll(lns)
}

// Bound is the listener group (ListenGroup) opened for one listen address
// of a service by ListenAll.
type Bound struct {
	Listeners []net.Listener
	Service   *exchange.Service
}

// ListenAll opens every Services[].Listen address of the current
// configuration (listener mode): a SO_REUSEPORT group of one socket per
// CPU (runtime.GOMAXPROCS) on each. On error it closes what it opened.
func (p *Proxy) ListenAll(ctx context.Context) ([]Bound, error) {
	cfg := p.cfg.Load()
	var out []Bound
	for _, s := range cfg.Services {
		for _, a := range s.Listen {
			lns, err := ListenGroup(ctx, a, p.lg.n)
			if err != nil {
				for _, b := range out {
					closeListeners(b.Listeners)
				}
				return nil, fmt.Errorf("service %s: %w", s.Name, err)
			}
			out = append(out, Bound{lns, s})
		}
	}
	if len(out) == 0 {
		return nil, errors.New("proxy: no service has a listen address")
	}
	return out, nil
}

// ServeAll serves every bound listener group until Shutdown (it returns
// nil then) or until one fails (it closes the others and returns that
// error).
func (p *Proxy) ServeAll(bound []Bound) error {
	errc := make(chan error, len(bound))
	for _, b := range bound {
		go func() { errc <- p.ServeGroup(b.Listeners, b.Service) }()
	}
	var first error
	for range bound {
		if err := <-errc; err != nil && err != ErrClosed && first == nil {
			first = err
			for _, b := range bound {
				closeListeners(b.Listeners)
			}
		}
	}
	return first
}

func (p *Proxy) serve(ln net.Listener, pick func(*Config, netip.AddrPort) *exchange.Service) error {
	return p.lg.serve(ln, pick)
}

// Shutdown stops accepting, closes idle client connections, lets in-flight
// requests finish (their connections close after the current response),
// then closes pooled upstream connections. If ctx ends first, remaining
// connections are closed forcibly and ctx's error is returned.
func (p *Proxy) Shutdown(ctx context.Context) error {
	p.mu.Lock()
	if !p.shutdown.Load() {
		close(p.drain)
	}
	p.shutdown.Store(true)
	for ln := range p.listeners {
		ln.Close()
	}
	p.mu.Unlock()
	return p.lg.shutdown(ctx)
}

// Stats are point-in-time counts.
type Stats struct {
	Conns        int // open client connections
	UpstreamIdle int // idle pooled upstream connections
	// UpstreamPools counts the loops' per-upstream pools: one per loop and
	// upstream address in use, dropped a minute after its last connection.
	UpstreamPools int
	// Requests counts requests in progress on the loops (a head begun
	// until its response is done; Config.HoldPInFlight).
	Requests int
	// UpstreamDiscarded counts upstream connections (pooled or pinned)
	// closed instead of pooled or reused because they had unread bytes or
	// were closed by the upstream; clean ones closed for idling too long
	// or after a configuration change are not counted.
	UpstreamDiscarded uint64
	// UpstreamLookups counts the loops' lookups of upstream host names;
	// UpstreamLookupErrors those that failed or gave no usable address
	// (the requests waiting got 502 unless earlier addresses were kept).
	UpstreamLookups, UpstreamLookupErrors uint64
	// Attached counts the LoopAttachers registered with Attach and not
	// Detached (they stay registered through Shutdown).
	Attached int
	// Loops is the event loops' own counts (turns, waits, buffers); zero
	// before the first Serve starts them.
	Loops evloop.Stats
}

// Stats returns current counts.
func (p *Proxy) Stats() Stats { return p.lg.stats() }
