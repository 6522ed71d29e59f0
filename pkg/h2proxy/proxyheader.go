package h2proxy

import (
	"context"
	"errors"
	"net"
	"sync"

	"github.com/rl-tproxy/rl-tproxy/pkg/exchange"
	"github.com/rl-tproxy/rl-tproxy/pkg/proxyproto"
)

// A service with proxy_protocol gets a PROXY header on every upstream
// connection. The header names one client, so those connections cannot
// be shared between client connections as the service's pool is: each
// client connection gets its own transport (its own HTTP/2 or HTTP/1.1
// connections, created on its first stream), whose dialer writes the
// header, and closes it when the client connection ends.
type connUpstream struct {
	mu     sync.Mutex
	ups    upstreams
	cfg    *exchange.Config
	closed bool
}

// upstream returns the transport of a stream of h: the service's shared
// one, or the client connection's own when the service wants a PROXY
// header.
func (h *conn) upstream() (*upstream, error) {
	if h.svc.ProxyProtocol == proxyproto.None || h.hc == nil {
		return h.srv.ups.get(h.svc, h.cfg)
	}
	cu := &h.hc.ppUp
	cu.mu.Lock()
	defer cu.mu.Unlock()
	if cu.closed {
		return nil, errors.New("client connection closed")
	}
	if cu.cfg == nil {
		cu.ups.init()
		cfg := *h.cfg
		base := h.cfg
		svc, remote, local := h.svc, h.remote, h.local
		timeout := svc.UpstreamTimeoutOrDefault()
		cfg.Dial = func(ctx context.Context, _, addr string) (net.Conn, error) {
			c, err := base.DialUpstream(ctx, addr)
			if err != nil {
				return nil, err
			}
			if err := exchange.WriteProxyHeader(c, svc, remote, local, timeout); err != nil {
				c.Close()
				return nil, err
			}
			return c, nil
		}
		cu.cfg = &cfg
	}
	return cu.ups.get(h.svc, cu.cfg)
}

// close closes the client connection's own upstream connections (idle
// ones now; busy ones finish their stream and close at the transport's
// idle timeout).
func (cu *connUpstream) close() {
	cu.mu.Lock()
	defer cu.mu.Unlock()
	cu.closed = true
	if cu.cfg != nil {
		cu.ups.close()
	}
}
