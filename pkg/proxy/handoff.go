package proxy

import (
	"net"
	"net/netip"
	"time"

	"github.com/rl-tproxy/rl-tproxy/pkg/sniff"
)

// Handoff serves connections whose first bytes are not HTTP/1.x. It is the
// proxy's one protocol dispatch point: with Config.Handoff set, the first
// bytes of every connection (read within the service's header timeout)
// are classified by pkg/sniff; HTTP/1.x stays on the proxy's own path, and
// the other kinds go to the Handoff when it Takes them (else to the
// HTTP/1.x path, which answers what it cannot parse with 400 and closes).
type Handoff interface {
	// Takes reports whether ServeConn serves connections of kind for svc.
	// It must not block.
	Takes(kind sniff.Kind, svc *Service) bool
	// ServeConn owns hc.Conn until it returns; the proxy closes the
	// connection afterwards. hc is valid only during the call.
	ServeConn(hc *HandoffConn)
}

// ConnMode is what a service does with connections of a kind the proxy
// does not serve itself (Service.TLS, Service.Opaque).
type ConnMode uint8

const (
	// ModeDefault: for TLS, the Opaque mode applies; for Opaque,
	// passthrough.
	ModeDefault ConnMode = iota
	// ModePassthrough relays the bytes unchanged (TLS: after reading the
	// ClientHello and admitting the connection).
	ModePassthrough
	// ModeReject closes the connection.
	ModeReject
)

// HandoffConn is a connection handed off after protocol detection.
type HandoffConn struct {
	Conn net.Conn
	Kind sniff.Kind
	// Buffered holds the bytes already read from Conn (at least the ones
	// that decided Kind); the handler consumes them before reading Conn.
	// Its spare capacity is free read buffer the handler may fill (a TLS
	// handler reads the rest of a ClientHello there). Valid until
	// ServeConn returns.
	Buffered      []byte
	Remote, Local netip.AddrPort // Local is the original destination
	Service       *Service
	Config        *Config
	// Start is the arrival of the first byte; HeaderDeadline is Start
	// plus the service's header timeout (Conn's read deadline is armed
	// with it when the handoff begins).
	Start, HeaderDeadline time.Time
	// Drain is closed when the proxy begins a graceful shutdown: a
	// handler finishes what it is doing (an HTTP/2 GOAWAY, say) and
	// returns. Shutdown's context bounds the wait; then Conn is closed.
	Drain <-chan struct{}
}

// HandoffMux routes handed-off connections by kind. A nil field takes
// nothing of that kind.
type HandoffMux struct {
	HTTP2, TLS, Other Handoff
}

func (m *HandoffMux) route(kind sniff.Kind) Handoff {
	switch kind {
	case sniff.HTTP2:
		return m.HTTP2
	case sniff.TLS:
		return m.TLS
	case sniff.Other:
		return m.Other
	}
	return nil
}

// Takes implements Handoff.
func (m *HandoffMux) Takes(kind sniff.Kind, svc *Service) bool {
	h := m.route(kind)
	return h != nil && h.Takes(kind, svc)
}

// ServeConn implements Handoff.
func (m *HandoffMux) ServeConn(hc *HandoffConn) { m.route(hc.Kind).ServeConn(hc) }

// dispatch classifies a new connection's first bytes (some are buffered)
// and hands it off when it is not HTTP/1.x. It reports whether the
// connection was served (handed off, or closed after a header timeout);
// false leaves it to the HTTP/1.x path, with c.started set to the first
// byte's arrival so that the header timeout is not restarted.
func (c *conn) dispatch(cfg *Config) bool {
	svc := c.pick(cfg, c.local)
	if svc == nil {
		return false // serveOne closes it
	}
	start := cfg.now()
	c.started = start
	deadline := start.Add(svc.headerTimeout())
	armed := false
	kind := sniff.Detect(c.buf.unread())
	for kind == sniff.NeedMore {
		if c.buf.w == len(c.buf.b) {
			kind = sniff.HTTP1 // the parser judges a head this long
			break
		}
		if !armed {
			c.nc.SetReadDeadline(deadline)
			armed = true
		}
		if _, err := c.fill(headNeed(svc.Limits)); err != nil {
			if isTimeout(err) {
				c.sniffTimeout(cfg, svc)
			}
			return true
		}
		kind = sniff.Detect(c.buf.unread())
	}
	if kind == sniff.HTTP1 || !cfg.Handoff.Takes(kind, svc) {
		return false
	}
	c.nc.SetReadDeadline(deadline)
	c.hc = HandoffConn{Conn: c.nc, Kind: kind, Buffered: c.buf.unread(), Remote: c.remote, Local: c.local,
		Service: svc, Config: cfg, Start: start, HeaderDeadline: deadline, Drain: c.p.drain}
	cfg.Handoff.ServeConn(&c.hc)
	c.hc = HandoffConn{}
	c.buf.r = c.buf.w
	return true
}

// sniffTimeout ends a connection whose first bytes did not decide its
// protocol within the header timeout: a would-be HTTP/1.x request gets
// the parser path's 408, anything else is closed.
func (c *conn) sniffTimeout(cfg *Config, svc *Service) {
	if b := c.buf.unread(); len(b) > 0 && b[0] != 0x16 {
		c.rejectRule(cfg, svc, "header-timeout", 408)
		return
	}
	cfg.logger().Debug("protocol detection timed out", "service", svc.Name, "remote", c.remote)
	reportReject(cfg, svc, c.remote, "detect-timeout", 0)
}
