// Package h1client is the pooled HTTP/1.1 client to one upstream for
// requests that did not arrive over HTTP/1.1: an http.RoundTripper whose
// every response head gets the verdict the HTTP/1.1 event loops give it
// (httpparse.Response.ParseUpstream, httpparse.ChunkedDecoder), so an
// upstream's malformed response is refused alike whichever client
// protocol asked.
package h1client

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"slices"
	"sync"
	"time"
)

// Config is one upstream's client.
type Config struct {
	// Addr is the upstream's host:port: every request goes there,
	// whatever its URL names.
	Addr string
	// Dial opens a connection to Addr; ctx is the request's.
	Dial func(ctx context.Context, network, addr string) (net.Conn, error)
	// HeadTimeout bounds the wait for the final response head (interim
	// responses and a head that dribbles in included), counted from the
	// end of the request: from the write of a body-less request's head,
	// from the last byte of a request body. A body-less request's head
	// write is bounded by it too. 0: no bound.
	HeadTimeout time.Duration
	// BodyIdle fails a read of the response body that got no byte for
	// this long. 0: no bound.
	BodyIdle time.Duration
	// MaxIdle bounds the idle connections kept for reuse. 0 or less keeps
	// none: every request then says Connection: close.
	MaxIdle int
	// IdleTimeout closes a pooled connection idle this long. 0: no bound.
	IdleTimeout time.Duration
}

// Pool is a keep-alive pool of HTTP/1.1 connections to Config.Addr,
// one exchange per connection at a time. Its zero value is not usable:
// make one with New.
type Pool struct {
	cfg Config

	mu     sync.Mutex
	idle   []*conn // most recently used last
	closed bool
}

// New returns the pool of cfg.
func New(cfg Config) *Pool {
	if cfg.Dial == nil {
		var d net.Dialer
		cfg.Dial = d.DialContext
	}
	return &Pool{cfg: cfg}
}

// RoundTrip sends req and returns the response head; the body streams
// from the connection as it is read. A body-less GET, HEAD, OPTIONS or
// TRACE whose pooled connection failed before any response byte arrived
// (the upstream closed it as it was taken) is tried once more on a new
// connection. req.Body is always closed.
func (p *Pool) RoundTrip(req *http.Request) (*http.Response, error) {
	ctx := req.Context()
	for attempt := 0; ; attempt++ {
		if err := ctx.Err(); err != nil {
			closeReqBody(req)
			return nil, err
		}
		c, err := p.get(ctx, attempt > 0)
		if err != nil {
			closeReqBody(req)
			return nil, err
		}
		res, err := c.roundTrip(req)
		if err == nil {
			return res, nil
		}
		if attempt > 0 || !c.reused || c.readAny || !Replayable(req) || ctx.Err() != nil {
			return nil, err
		}
	}
}

// Replayable reports whether req may be sent twice, on another
// connection, after a reused connection failed before any response byte:
// no body, and a method that changes nothing. The h2c upstream pool
// retries by the same rule.
func Replayable(req *http.Request) bool {
	if req.Body != nil && req.Body != http.NoBody {
		return false
	}
	switch req.Method {
	case http.MethodGet, http.MethodHead, http.MethodOptions, http.MethodTrace:
		return true
	}
	return false
}

func closeReqBody(req *http.Request) {
	if req.Body != nil {
		_ = req.Body.Close()
	}
}

// get returns a pooled connection that is still clean (nothing queued
// on it, not closed by the upstream), else a new one; fresh skips the
// pool.
func (p *Pool) get(ctx context.Context, fresh bool) (*conn, error) {
	for !fresh {
		p.mu.Lock()
		n := len(p.idle)
		if n == 0 {
			p.mu.Unlock()
			break
		}
		c := p.idle[n-1]
		p.idle[n-1] = nil
		p.idle = p.idle[:n-1]
		p.mu.Unlock()
		if c.timer != nil {
			c.timer.Stop()
		}
		if c.clean() {
			c.reused = true
			return c, nil
		}
		_ = c.nc.Close()
	}
	nc, err := p.cfg.Dial(ctx, "tcp", p.cfg.Addr)
	if err != nil {
		return nil, err
	}
	return newConn(p, nc), nil
}

// put pools c after a clean exchange, or closes it.
func (p *Pool) put(c *conn) {
	p.mu.Lock()
	if p.closed || len(p.idle) >= p.cfg.MaxIdle {
		p.mu.Unlock()
		_ = c.nc.Close()
		return
	}
	p.idle = append(p.idle, c)
	if d := p.cfg.IdleTimeout; d > 0 {
		c.idleSince = time.Now()
		if c.timer == nil {
			c.timer = time.AfterFunc(d, c.expire)
		} else {
			c.timer.Reset(d)
		}
	}
	p.mu.Unlock()
}

// expire closes c if it is still pooled and has been idle for the whole
// IdleTimeout (a timer that fired as c was taken and pooled again finds
// it younger, and its re-armed timer comes later).
func (c *conn) expire() {
	p := c.p
	p.mu.Lock()
	i := slices.Index(p.idle, c)
	if i < 0 || time.Since(c.idleSince) < p.cfg.IdleTimeout {
		p.mu.Unlock()
		return
	}
	p.idle = slices.Delete(p.idle, i, i+1)
	p.mu.Unlock()
	_ = c.nc.Close()
}

// CloseIdleConnections closes the idle connections; connections busy
// now close when their exchange ends instead of being pooled. Later
// requests still work, each on a connection of its own.
func (p *Pool) CloseIdleConnections() {
	p.mu.Lock()
	idle := p.idle
	p.idle, p.closed = nil, true
	p.mu.Unlock()
	for _, c := range idle {
		if c.timer != nil {
			c.timer.Stop()
		}
		_ = c.nc.Close()
	}
}

// Idle reports the pooled idle connections, for tests and metrics.
func (p *Pool) Idle() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.idle)
}

// errUpgrade: a 101 to a request that asked for no upgrade (the client
// sends none: an HTTP/2 client cannot take over the connection).
var errUpgrade = errors.New("101 Switching Protocols to a request that asked for no upgrade")

// headError wraps a failure to get the response head.
func headError(err error) error { return fmt.Errorf("response head: %w", err) }
