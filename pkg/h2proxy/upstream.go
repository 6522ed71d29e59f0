package h2proxy

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/rl-tproxy/rl-tproxy/pkg/exchange"
	"github.com/rl-tproxy/rl-tproxy/pkg/h1client"
)

// Upstream protocols (exchange.Service.UpstreamProtocol).
const (
	ProtoAuto  = "auto"  // the client's: h2c for HTTP/2 clients
	ProtoHTTP1 = "http1" // HTTP/1.1 over pooled keep-alive connections
	ProtoH2C   = "h2c"   // HTTP/2 prior knowledge, multiplexed
)

// upstream is the pooled transport of one (address, protocol): an
// h2cPool multiplexes streams over few HTTP/2 connections (opening
// another when the upstream's stream limit is reached); an h1client.Pool
// keeps HTTP/1.1 connections alive and reads their responses as strictly
// as the HTTP/1.1 loops do.
type upstream struct {
	rt     http.RoundTripper
	closer interface{ CloseIdleConnections() }
	used   bool // got since the last sweep (upstreams.mu)
}

// upstreamSweep is how often unused transports are dropped: one no
// stream asked for during a whole period is closed (its idle connections
// now, busy ones when their streams end) and forgotten, so upstreams and
// timeouts a reload stopped naming do not pile up. A variable for tests.
var upstreamSweep = time.Minute

// The receive windows of the h2c upstream transport, which bound what
// the proxy buffers of a response its client does not take (a client
// that stops reading, or sets its window to 0). A stream's window is what
// the transport holds of the response until the relay reads it; the
// relay reads only as fast as the client's stream takes the data, so a
// stalled client costs at most UpstreamStreamWindow (plus the relay's 32
// KiB copy buffer) per stream, not Go's default of 4 MiB. The connection
// window is large enough for every stream of a connection to fill its
// own (no stalled stream can block the others sharing the upstream
// connection) and bounded all the same.
const (
	UpstreamStreamWindow = 256 << 10
	UpstreamConnWindow   = 256 * UpstreamStreamWindow // 64 MiB: 256 streams, each at its window
)

// upstreamHeaderTableSize is the HPACK dynamic table the proxy's encoder
// uses towards an h2c upstream: no field fits (HTTP2Config's minimum,
// zero means the 4096-byte default).
const upstreamHeaderTableSize = 1

type upKey struct {
	addr, proto string
	timeout     time.Duration
	// bodyIdle bounds an HTTP/1.1 upstream's silence mid-body (the
	// service's idle timeout, as on the HTTP/1.1 loops).
	bodyIdle time.Duration
}

type upstreams struct {
	mu    sync.Mutex
	m     map[upKey]*upstream
	sweep *time.Timer // armed while m has entries
}

func (u *upstreams) init() { u.m = map[upKey]*upstream{} }

// get returns the transport for svc's upstream, creating it on first use.
// Its dialer is cfg.Dial (the redirect's bypassing dialer) as of creation.
func (u *upstreams) get(svc *exchange.Service, cfg *exchange.Config) (*upstream, error) {
	proto := svc.UpstreamProtocol
	switch proto {
	case "", ProtoAuto:
		proto = ProtoH2C
	case ProtoHTTP1, ProtoH2C:
	default:
		return nil, fmt.Errorf("service %s: unknown upstream protocol %q", svc.Name, proto)
	}
	timeout := durOr(svc.UpstreamTimeout, exchange.DefaultUpstreamTimeout)
	key := upKey{addr: svc.Upstream, proto: proto, timeout: timeout}
	if proto == ProtoHTTP1 {
		key.bodyIdle = svc.IdleTimeoutOrDefault()
	}
	u.mu.Lock()
	defer u.mu.Unlock()
	if up := u.m[key]; up != nil {
		up.used = true
		return up, nil
	}
	dialTimed := func(ctx context.Context, _, addr string) (net.Conn, error) {
		ctx, cancel := context.WithTimeout(ctx, timeout)
		defer cancel()
		c, err := cfg.DialUpstream(ctx, addr)
		if err != nil {
			return nil, fmt.Errorf("dial %s: %w", addr, err)
		}
		if proto == ProtoHTTP1 {
			// One request at a time per connection: nothing to batch,
			// and a write straight from the transport's writer saves
			// the coalescer's goroutine per request.
			return c, nil
		}
		return newCoalescer(c), nil
	}
	idle := durOr(cfg.UpstreamIdleTimeout, exchange.DefaultUpstreamIdleTimeout)
	var up *upstream
	if proto == ProtoH2C {
		var protos http.Protocols
		protos.SetUnencryptedHTTP2(true)
		t := &http.Transport{
			Protocols:              &protos,
			DialContext:            dialTimed,
			DisableCompression:     true,
			IdleConnTimeout:        idle,
			ResponseHeaderTimeout:  timeout, // counted from the end of the request body
			MaxResponseHeaderBytes: 1 << 20,
			HTTP2: &http.HTTP2Config{
				SendPingTimeout: 30 * time.Second, // health check of a silent connection
				PingTimeout:     15 * time.Second,
				// No HPACK dynamic table for request heads (what nginx's
				// grpc_pass does too): a field whose value changes per
				// request (the generated X-Request-ID, trace ids) would
				// enter the table and evict the oldest entry on every
				// request, the encoder's costliest path, and deep enough
				// to make the request's writer goroutine copy its stack.
				// Names still come from the static table.
				MaxEncoderHeaderTableSize:     upstreamHeaderTableSize,
				MaxReceiveBufferPerStream:     UpstreamStreamWindow,
				MaxReceiveBufferPerConnection: UpstreamConnWindow,
			},
		}
		pool := &h2cPool{t: t, addr: svc.Upstream}
		up = &upstream{rt: pool, closer: pool}
	} else {
		maxIdle := cfg.MaxIdlePerUpstream
		if maxIdle == 0 {
			maxIdle = exchange.DefaultMaxIdlePerUpstream
		}
		pool := h1client.New(h1client.Config{
			Addr:        svc.Upstream,
			Dial:        dialTimed,
			HeadTimeout: timeout,
			BodyIdle:    key.bodyIdle,
			MaxIdle:     maxIdle, // negative: none, every request says Connection: close
			IdleTimeout: idle,
		})
		up = &upstream{rt: pool, closer: pool}
	}
	up.used = true
	u.m[key] = up
	if u.sweep == nil {
		u.sweep = time.AfterFunc(upstreamSweep, u.sweepUnused)
	}
	return up, nil
}

// sweepUnused drops the transports not used since the last sweep.
func (u *upstreams) sweepUnused() {
	u.mu.Lock()
	defer u.mu.Unlock()
	for k, up := range u.m {
		if !up.used {
			up.closer.CloseIdleConnections()
			delete(u.m, k)
		}
		up.used = false
	}
	if u.sweep == nil { // closed meanwhile
		return
	}
	if len(u.m) > 0 {
		u.sweep.Reset(upstreamSweep)
	} else {
		u.sweep = nil
	}
}

// close closes the idle upstream connections (after a drain).
func (u *upstreams) close() {
	u.mu.Lock()
	defer u.mu.Unlock()
	for k, up := range u.m {
		up.closer.CloseIdleConnections()
		delete(u.m, k)
	}
	if u.sweep != nil {
		u.sweep.Stop()
		u.sweep = nil
	}
}
