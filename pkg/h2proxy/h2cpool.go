package h2proxy

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"

	"github.com/rl-tproxy/rl-tproxy/pkg/h1client"
)

// h2cPool is the pool of HTTP/2 prior-knowledge connections to one
// upstream. An http.Transport does the same, but each RoundTrip through
// it also resolves the connect method, looks the connection up in its
// cache under a lock and wraps the request's context (~6% of the proxy's
// CPU per stream under h2load); here a stream takes a concurrency slot
// (ClientConn.Reserve) on the first connection that has one and sends on
// it. A new connection is dialled, one dial at a time, when every
// connection is at the upstream's stream limit, has had a GOAWAY, or is
// closed; connections that failed leave the pool when a stream next
// looks at them. The Transport only creates connections
// (Transport.NewClientConn) and supplies the dialer, the idle timeout
// and the HTTP/2 settings.
type h2cPool struct {
	t    *http.Transport
	addr string

	mu     sync.Mutex
	conns  []*http.ClientConn
	dial   *poolDial // the dial in flight, nil if none
	closed bool
}

// poolDial is one dial that streams wait for.
type poolDial struct {
	done chan struct{}
	err  error
}

var errPoolClosed = errors.New("upstream pool closed")

// RoundTrip sends req on a pooled connection. A request without a body
// and with an idempotent method is tried once more on another connection
// when its connection failed before the response head (the connection
// may have ended between the reservation and the send, as a GOAWAY
// racing the stream does).
func (p *h2cPool) RoundTrip(req *http.Request) (*http.Response, error) {
	for attempt := 0; ; attempt++ {
		cc, err := p.reserve(req.Context())
		if err != nil {
			return nil, err
		}
		res, err := cc.RoundTrip(req)
		if err == nil || attempt > 0 || req.Context().Err() != nil || cc.Err() == nil || !h1client.Replayable(req) {
			return res, err
		}
	}
}

// reserve returns a connection with a concurrency slot reserved for one
// RoundTrip, dialling a new one if none has a free slot.
func (p *h2cPool) reserve(ctx context.Context) (*http.ClientConn, error) {
	for {
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			return nil, errPoolClosed
		}
		live := p.conns[:0]
		var found *http.ClientConn
		for _, cc := range p.conns {
			if found == nil && cc.Reserve() == nil {
				found = cc
			} else if found == nil && cc.Err() != nil {
				_ = cc.Close()
				continue
			}
			live = append(live, cc)
		}
		clear(p.conns[len(live):])
		p.conns = live
		if found != nil {
			p.mu.Unlock()
			return found, nil
		}
		d := p.dial
		if d == nil {
			d = &poolDial{done: make(chan struct{})}
			p.dial = d
			go p.dialOne(d)
		}
		p.mu.Unlock()
		select {
		case <-d.done:
			if d.err != nil {
				return nil, d.err
			}
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// dialOne opens a connection for the pool. It does not use a stream's
// context: the connection outlives the stream that asked for it (the
// dialer bounds the dial by the upstream timeout).
func (p *h2cPool) dialOne(d *poolDial) {
	cc, err := p.t.NewClientConn(context.Background(), "http", p.addr)
	if err != nil {
		err = fmt.Errorf("h2c connection to %s: %w", p.addr, err)
	}
	p.mu.Lock()
	if err == nil {
		if p.closed {
			_ = cc.Close()
			err = errPoolClosed
		} else {
			p.conns = append(p.conns, cc)
		}
	}
	d.err = err
	p.dial = nil
	p.mu.Unlock()
	close(d.done)
}

// CloseIdleConnections closes the pool: idle connections now, busy ones
// when their streams end (the Transport's idle timeout); later streams
// fail.
func (p *h2cPool) CloseIdleConnections() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closed = true
	for _, cc := range p.conns {
		if cc.InFlight() == 0 {
			_ = cc.Close()
		}
	}
	p.conns = nil
}
