package proxy

import (
	"fmt"
	"net/netip"
	"time"

	"github.com/rl-tproxy/rl-tproxy/pkg/proxyproto"
)

// A PROXY protocol header names one client, and a service reads it once
// per connection: an upstream connection that carried it may serve later
// requests of the same client connection only. So for such services the
// proxy keeps at most one idle upstream connection per client connection
// (c.pinned) instead of the shared pool, and closes it with the client
// connection.

// getPinned returns the client connection's idle upstream connection, or
// dials one and writes the PROXY header. The idle one is reused only while
// the service still names its address and PROXY version (Proxy.Update may
// have changed either) and it is clean; one found unclean is counted in
// Stats.UpstreamDiscarded.
func (c *conn) getPinned(cfg *Config, svc *Service, fresh bool) (*upConn, error) {
	if u := c.pinned; u != nil {
		c.pinned = nil
		switch {
		case fresh || u.pool.addr != svc.Upstream || u.proxyVersion != svc.ProxyProtocol:
			u.close()
		case u.clean():
			u.reused = true
			return u, nil
		default:
			c.p.pools.discard(u)
		}
	}
	u, err := c.p.pools.get(cfg, svc.Upstream, svc.upstreamTimeout(), true)
	if err != nil {
		return nil, err
	}
	u.pinned = true
	u.proxyVersion = svc.ProxyProtocol
	hdr := proxyproto.Append(c.ppbuf[:0], svc.ProxyProtocol, c.remote, c.local)
	if _, err := c.w.writeTimeout(u.nc, u.raw, hdr, svc.upstreamTimeout()); err != nil {
		u.close()
		return nil, fmt.Errorf("write PROXY header to %s: %w", svc.Upstream, err)
	}
	return u, nil
}

// keepPinned keeps u for the client connection's next request (without a
// buffer while idle) unless its buffer holds unconsumed bytes (then it is
// discarded and counted). As for the shared pool, the socket is peeked
// only at reuse (getPinned): whatever is queued now is still queued then.
func (c *conn) keepPinned(u *upConn) {
	if u.buffered() {
		c.p.pools.discard(u)
		return
	}
	u.buf.put()
	u.reused = false
	c.pinned = u
}

// dropPinned closes the client connection's idle upstream connection.
func (c *conn) dropPinned() {
	if c.pinned != nil {
		c.pinned.close()
		c.pinned = nil
	}
}

// WriteProxyHeader writes the service's PROXY protocol header (if it has
// one) for a connection from client to orig (the address the client
// connected to) on up, a fresh upstream connection, within timeout. The
// HTTP/2 and passthrough paths call it after dialing the upstream.
func WriteProxyHeader(up interface {
	Write([]byte) (int, error)
	SetWriteDeadline(time.Time) error
}, svc *Service, client, orig netip.AddrPort, timeout time.Duration) error {
	if svc.ProxyProtocol == proxyproto.None {
		return nil
	}
	var buf [proxyproto.MaxLen]byte
	hdr := proxyproto.Append(buf[:0], svc.ProxyProtocol, client, orig)
	up.SetWriteDeadline(time.Now().Add(timeout))
	_, err := up.Write(hdr)
	up.SetWriteDeadline(time.Time{})
	if err != nil {
		return fmt.Errorf("write PROXY header to %s: %w", svc.Upstream, err)
	}
	return nil
}
