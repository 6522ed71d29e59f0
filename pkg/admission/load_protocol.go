package admission

import (
	"gopkg.in/yaml.v3"

	"github.com/rl-tproxy/rl-tproxy/pkg/proxyproto"
)

// TLSMode is what a service does with a TLS ClientHello on its port.
type TLSMode uint8

const (
	// TLSOpaque (the default): TLS is one more protocol the proxy does
	// not speak; the service's Opaque setting applies.
	TLSOpaque TLSMode = iota
	// TLSPassthrough: the ClientHello is read (SNI, ALPN), the
	// connection is admitted once through the service's locations, and
	// the bytes are relayed unchanged (TLS is not terminated).
	TLSPassthrough
	// TLSReject: TLS connections are closed (and counted).
	TLSReject
)

func (m TLSMode) String() string {
	switch m {
	case TLSPassthrough:
		return "passthrough"
	case TLSReject:
		return "reject"
	}
	return "opaque"
}

// OpaqueMode is what a service does with a connection whose first bytes
// are neither HTTP/1.x, nor HTTP/2, nor (with tls set) TLS.
type OpaqueMode uint8

const (
	// OpaquePassthrough (the default): bytes are relayed unchanged to the
	// upstream, without admission; a steered port never breaks a
	// protocol the proxy does not speak.
	OpaquePassthrough OpaqueMode = iota
	// OpaqueReject: the connection is closed (and counted).
	OpaqueReject
)

func (m OpaqueMode) String() string {
	if m == OpaqueReject {
		return "reject"
	}
	return "passthrough"
}

// protocolKeys are the service keys protocolKey parses.
var protocolKeys = []string{"tls", "opaque", "proxy_protocol"}

// protocolKey parses a service's tls, opaque or proxy_protocol key. It
// returns false for any other key.
func (l *loader) protocolKey(e kv, ctx string, svc *Service) bool {
	c := ctx + "." + e.key
	switch e.key {
	case "tls":
		if s, ok := l.str(e.v, c); ok {
			switch s {
			case "opaque":
				svc.TLS = TLSOpaque
			case "passthrough":
				svc.TLS = TLSPassthrough
			case "reject":
				svc.TLS = TLSReject
			default:
				l.errorf(e.v, "%s: want passthrough, reject or opaque, got %q", c, short(s))
			}
		}
	case "opaque":
		if s, ok := l.str(e.v, c); ok {
			switch s {
			case "passthrough":
				svc.Opaque = OpaquePassthrough
			case "reject":
				svc.Opaque = OpaqueReject
			default:
				l.errorf(e.v, "%s: want passthrough or reject, got %q", c, short(s))
			}
		}
	case "proxy_protocol":
		if s, ok := l.str(e.v, c); ok {
			v, err := proxyproto.ParseVersion(s)
			if err != nil || v == proxyproto.None {
				l.errorf(e.v, "%s: want v1 or v2, got %q", c, short(s))
			}
			svc.ProxyProtocol = v
		}
	default:
		return false
	}
	return true
}

// checkProtocols reports locations that match on SNI in a service that
// does not read ClientHellos (they could never match).
func (l *loader) checkProtocols(svc *Service, n *yaml.Node, ctx string) {
	if svc.TLS == TLSPassthrough {
		return
	}
	for _, loc := range svc.Locations {
		if len(loc.Match.SNI) > 0 {
			l.errorf(n, "%s: location %q matches on sni, which needs tls: passthrough on the service (line %d)", ctx, loc.Name, loc.Line)
		}
	}
}
