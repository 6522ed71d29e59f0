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
//     no unread bytes, buffered or queued on its socket, and was not closed
//     (buffered bytes are checked at release, the socket with one
//     non-blocking peek at every reuse, pinned connections included). Bytes the
//     response's framing does not account for (after a complete response,
//     a body after HEAD/204/304, an early second response) poison it: it
//     is closed, and no later client sees them.
//   - A pooled upstream connection that fails before any response byte is
//     retried once on a fresh connection, only for idempotent requests
//     without a body.
//   - With a Hook, a client that goes away is noticed during admission
//     and until its response is completely written: Result.ClientAborted
//     is set and an upstream exchange in progress is cancelled (its
//     connection closed, not pooled). A reset or a failed write is an
//     abort; a FIN is one only during admission (after it, a client that
//     merely shut down its write side still gets the response). A Hook
//     that is an OnDemandWatcher has only the requests watched that it
//     asks for (WatchClient). See watch.go.
//   - Idle keep-alive connections hold no buffers; after
//     Config.ParkIdleAfter they also give up their goroutine (see park.go).
//   - Pools shrink after a burst: idle watcher goroutines exit after
//     DefaultWatcherIdleTimeout, idle upstream connections after
//     UpstreamIdleTimeout, and when the connections and watchers of a
//     burst are gone the proxy empties its sync.Pools and returns free
//     memory to the OS (see trim.go).
//   - Shutdown (graceful drain) closes idle keep-alive connections at
//     once, but waits for the first request of a just-accepted connection
//     for up to Service.HeaderTimeout after its accept; that request is
//     served with Connection: close.
//   - Update swaps the configuration for new requests; a request keeps the
//     configuration it started with.
//   - A listen address is normally a SO_REUSEPORT group of sockets
//     (ListenGroup, one per CPU), across which the kernel spreads
//     connections; ServeGroup, ServeSteeredGroup and ServeAll serve every
//     socket of a group (group.go).
//   - Config.EventLoops > 0 serves HTTP/1.x connections on that many event
//     loops (pkg/evloop; loop.go) with the behaviour above. There, every
//     client is watched by its loop (no watcher goroutines, no parking: an
//     idle connection holds neither a goroutine nor a buffer), upstream
//     pools are per loop (MaxIdlePerUpstream per loop and address), a
//     pooled upstream connection that gets bytes or an EOF while it idles
//     is discarded at once, and a Hook's Admit runs on a worker goroutine
//     whose Decision is posted back to the loop.
package proxy

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"
)

// Proxy serves HTTP/1.1 clients on any number of listeners.
type Proxy struct {
	cfg      atomic.Pointer[Config]
	pools    upstreams
	watchers watchers
	parker   parker

	mu        sync.Mutex
	listeners map[net.Listener]struct{}
	conns     map[*conn]struct{}
	shutdown  atomic.Bool
	trim      trimState
	drain     chan struct{}  // closed when Shutdown begins (HandoffConn.Drain)
	wg        sync.WaitGroup // accept loops and connection goroutines

	lg *loopGroup // the event-loop data path (Config.EventLoops > 0), else nil
}

// defaultEventLoops is the EventLoops of a Config that leaves it 0 (tests
// set it to run the package's suite on the event-loop path).
var defaultEventLoops int

// New validates cfg and returns a Proxy. Nothing listens until Serve,
// ServeSteered or ListenAndServe.
func New(cfg Config) (*Proxy, error) {
	if err := cfg.validate(); err != nil {
		return nil, fmt.Errorf("proxy config: %w", err)
	}
	p := &Proxy{
		listeners: map[net.Listener]struct{}{},
		conns:     map[*conn]struct{}{},
		drain:     make(chan struct{}),
	}
	p.pools.init()
	p.watchers.onShrink = p.checkTrim
	c := cfg
	if c.EventLoops == 0 {
		c.EventLoops = defaultEventLoops
	}
	if c.EventLoops > 0 {
		p.lg = newLoopGroup(p, c.EventLoops)
	}
	p.cfg.Store(&c)
	return p, nil
}

// Update swaps the configuration for new requests. Requests already past
// their head keep the configuration (service, hook, timeouts) they started
// with. Listener addresses are not reopened: a changed Listen list needs
// new Serve calls by the caller.
func (p *Proxy) Update(cfg Config) error {
	if err := cfg.validate(); err != nil {
		return fmt.Errorf("proxy config: %w", err)
	}
	c := cfg
	p.cfg.Store(&c)
	return nil
}

// Config returns the current configuration.
func (p *Proxy) Config() *Config { return p.cfg.Load() }

func (c *Config) logger() *slog.Logger {
	if c.Logger != nil {
		return c.Logger
	}
	return discardLogger
}

var discardLogger = slog.New(slog.DiscardHandler)

func (c *Config) now() time.Time {
	if c.Now != nil {
		return c.Now()
	}
	return time.Now()
}

func (c *Config) service(name string) *Service {
	for _, s := range c.Services {
		if s.Name == name {
			return s
		}
	}
	return nil
}

// Serve accepts connections on ln for svc until ln fails or Shutdown. After
// Update, requests use the service of the same name in the new
// configuration (or svc if that name is gone).
func (p *Proxy) Serve(ln net.Listener, svc *Service) error {
	if svc == nil {
		return errors.New("proxy: Serve with nil service")
	}
	return p.serve(ln, pickNamed(svc))
}

// pickNamed picks the current configuration's service named like svc (or
// svc once that name is gone).
func pickNamed(svc *Service) func(*Config, netip.AddrPort) *Service {
	name := svc.Name
	return func(cfg *Config, _ netip.AddrPort) *Service {
		if s := cfg.service(name); s != nil {
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
func (p *Proxy) ServeSteered(ln net.Listener, pick func(cfg *Config, local netip.AddrPort) *Service) error {
	if pick == nil {
		pick = pickByPort
	}
	return p.serve(ln, pick)
}

// pickByPort picks the service whose Port is the destination port.
func pickByPort(cfg *Config, local netip.AddrPort) *Service {
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
	Service   *Service
}

// ListenAll opens every Services[].Listen address of the current
// configuration (listener mode): a SO_REUSEPORT group of one socket per
// CPU (runtime.GOMAXPROCS) on each. On error it closes what it opened.
func (p *Proxy) ListenAll(ctx context.Context) ([]Bound, error) {
	cfg := p.cfg.Load()
	var out []Bound
	for _, s := range cfg.Services {
		for _, a := range s.Listen {
			lns, err := ListenGroup(ctx, a, cfg.groupSize())
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

func (p *Proxy) serve(ln net.Listener, pick func(*Config, netip.AddrPort) *Service) error {
	if p.lg != nil {
		return p.lg.serve(ln, pick)
	}
	p.mu.Lock()
	if p.shutdown.Load() {
		p.mu.Unlock()
		ln.Close()
		return ErrClosed
	}
	p.listeners[ln] = struct{}{}
	p.wg.Add(1)
	p.mu.Unlock()
	defer p.wg.Done()
	defer func() {
		p.mu.Lock()
		delete(p.listeners, ln)
		p.mu.Unlock()
	}()
	var backoff time.Duration
	for {
		nc, err := ln.Accept()
		if err != nil {
			if p.shutdown.Load() {
				return ErrClosed
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() || transientAcceptErr(err) {
				// Transient (EMFILE and friends): back off and retry.
				backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
				p.cfg.Load().logger().Warn("accept", "err", err, "retry_in", backoff)
				time.Sleep(backoff)
				continue
			}
			return fmt.Errorf("accept on %s: %w", ln.Addr(), err)
		}
		backoff = 0
		c := newConn(p, nc, pick)
		if !p.track(c) {
			nc.Close()
			c.release()
			continue
		}
		go c.serve()
	}
}

func (p *Proxy) track(c *conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.shutdown.Load() {
		return false
	}
	p.conns[c] = struct{}{}
	p.noteTrimLocked(len(p.conns))
	p.wg.Add(1)
	return true
}

func (p *Proxy) untrack(c *conn) {
	p.mu.Lock()
	delete(p.conns, c)
	due := p.trimDueLocked()
	p.mu.Unlock()
	p.wg.Done()
	if due {
		go p.trimMemory()
	}
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
	if p.lg != nil {
		return p.lg.shutdown(ctx)
	}

	done := make(chan struct{})
	go func() { p.wg.Wait(); close(done) }()
	poll := time.Millisecond
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		p.closeIdle(time.Now())
		select {
		case <-done:
			p.pools.closeAll()
			p.watchers.close()
			p.stopTrim()
			p.parker.stop()
			return nil
		case <-ctx.Done():
			p.parker.closeParked(time.Time{})
			p.mu.Lock()
			for c := range p.conns {
				c.nc.Close()
			}
			p.mu.Unlock()
			<-done
			p.pools.closeAll()
			p.watchers.close()
			p.stopTrim()
			p.parker.stop()
			return ctx.Err()
		case <-timer.C:
			poll = min(2*poll, 100*time.Millisecond)
			timer.Reset(poll)
		}
	}
}

// closeIdle closes idle connections, except fresh ones (accepted, first
// request not arrived) before their freshUntil; Shutdown calls it until
// every connection ended.
func (p *Proxy) closeIdle(now time.Time) {
	p.parker.closeParked(now)
	p.mu.Lock()
	defer p.mu.Unlock()
	for c := range p.conns {
		if c.state.Load() != stateIdle || c.waitsFirst(now) {
			continue
		}
		if c.state.CompareAndSwap(stateIdle, stateClosed) {
			c.nc.Close()
		}
	}
}

// Stats are point-in-time counts.
type Stats struct {
	Conns        int // open client connections
	Parked       int // idle client connections parked without a goroutine
	UpstreamIdle int // idle pooled upstream connections
	// Watchers is the number of client-abort watcher goroutines alive
	// (running or idle; idle ones exit after DefaultWatcherIdleTimeout).
	Watchers int
	// WatchStarts counts client-abort watches started (an admission and
	// a response phase each count).
	WatchStarts uint64
	// UpstreamDiscarded counts upstream connections (pooled or pinned)
	// closed instead of pooled or reused because they had unread bytes or
	// were closed by the upstream; clean ones closed for idling too long
	// or after a configuration change are not counted.
	UpstreamDiscarded uint64
}

// Stats returns current counts.
func (p *Proxy) Stats() Stats {
	if p.lg != nil {
		return p.lg.stats()
	}
	p.mu.Lock()
	n := len(p.conns)
	p.mu.Unlock()
	return Stats{Conns: n, Parked: p.parker.parkedCount(), UpstreamIdle: p.pools.idleCount(),
		UpstreamDiscarded: p.pools.discarded.Load(), Watchers: p.watchers.count(),
		WatchStarts: p.watchers.starts.Load()}
}
