package exchange

import (
	"net"
	"net/netip"
	"time"

	"github.com/rl-tproxy/rl-tproxy/pkg/sniff"
)

// Handoff serves connections whose first bytes are not HTTP/1.x. It is
// the event loops' one protocol dispatch point: with proxy.Config.Handoff
// set, the first bytes of every connection (read within the service's
// header timeout) are classified by pkg/sniff; HTTP/1.x stays on the
// loops, and the other kinds go to the Handoff when it Takes them (else
// to the HTTP/1.x path, which answers what it cannot parse with 400 and
// closes).
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
	// Peer is the TCP peer when a PROXY header named another client as
	// Remote (Service.AcceptProxy); zero otherwise.
	Peer    netip.AddrPort
	Service *Service
	Config  *Config
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
