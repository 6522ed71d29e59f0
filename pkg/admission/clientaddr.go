package admission

import (
	"net/netip"

	"github.com/rl-tproxy/rl-tproxy/pkg/realip"
	"gopkg.in/yaml.v3"
)

// Client-address sources (`client_address.from`).
const (
	ClientFromXFF       = "x-forwarded-for"
	ClientFromForwarded = "forwarded"
)

// ClientAddress says where a service's requests name their real client
// when a balancer or proxy stands in front of the node: a forwarding
// header, believed only from a peer inside Trusted (realip).
type ClientAddress struct {
	From    string // ClientFromXFF or ClientFromForwarded
	Trusted *realip.Trusted
}

// Header is the request header the client is read from.
func (c *ClientAddress) Header() string { return c.From }

// Resolve returns the client of a request from peer whose From header
// lines are values (in arrival order): the rightmost address that is not
// trusted when peer is trusted and the list reads whole, else peer. A
// forwarded client's port is unknown (0). It does not allocate.
func (c *ClientAddress) Resolve(peer netip.AddrPort, values [][]byte) netip.AddrPort {
	if c == nil {
		return peer
	}
	var a netip.Addr
	var ok bool
	if c.From == ClientFromForwarded {
		a, ok = c.Trusted.FromForwarded(peer.Addr(), values)
	} else {
		a, ok = c.Trusted.FromXFF(peer.Addr(), values)
	}
	if !ok {
		return peer
	}
	return netip.AddrPortFrom(a, 0)
}

// clientAddress parses a service's client_address mapping.
func (l *loader) clientAddress(v *yaml.Node, c string, s *serviceSettings) {
	pairs, ok := l.mapping(v, c, "from", "trusted")
	if !ok {
		return
	}
	ca := &ClientAddress{}
	var cidrs []string
	var cidrNodes []*yaml.Node
	fromSet, trustedSet := false, false
	for _, f := range pairs {
		fc := c + "." + f.key
		switch f.key {
		case "from":
			m, ok := l.str(f.v, fc)
			if !ok {
				return
			}
			switch m {
			case ClientFromXFF, ClientFromForwarded:
				ca.From, fromSet = m, true
			default:
				l.errorf(f.v, "%s: want x-forwarded-for or forwarded, got %q", fc, short(m))
				return
			}
		case "trusted":
			ss, ns, ok := l.strList(f.v, fc)
			if !ok {
				return
			}
			cidrs, cidrNodes, trustedSet = ss, ns, true
		}
	}
	if !fromSet {
		l.errorf(v, "%s: from is required (x-forwarded-for or forwarded)", c)
		return
	}
	if !trustedSet || len(cidrs) == 0 {
		l.errorf(v, "%s: trusted is required: the balancers' addresses or CIDRs whose %s header is believed", c, ca.From)
		return
	}
	bad := false
	for i, s := range cidrs {
		if _, err := realip.ParseTrusted([]string{s}); err != nil {
			l.errorf(cidrNodes[i], "%s.trusted: %v", c, err)
			bad = true
		}
	}
	if bad {
		return
	}
	t, err := realip.ParseTrusted(cidrs)
	if err != nil { // each one parsed alone above
		l.errorf(v, "%s.trusted: %v", c, err)
		return
	}
	ca.Trusted = t
	s.clientAddr = ca
}
