package node

import (
	"fmt"
	"net"
	"net/netip"

	"github.com/rl-tproxy/rl-tproxy/pkg/admission"
)

// Preflight checks on this host what loading a policy cannot: that the
// RateLimitly client's bind address can be bound (`rl-tproxy check`).
// `run` does not need it to start: it retries a client it cannot create.
func Preflight(p *admission.Policy) error {
	b := p.RateLimitly.Bind
	if !b.IsValid() || b.IsUnspecified() {
		return nil
	}
	c, err := net.ListenUDP("udp", net.UDPAddrFromAddrPort(netip.AddrPortFrom(b, 0)))
	if err != nil {
		return fmt.Errorf("ratelimitly.bind %s: cannot bind a UDP socket on this host: %w", b, err)
	}
	return c.Close()
}
