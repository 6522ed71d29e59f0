package proxy

import (
	"errors"
	"net"
	"net/netip"

	"github.com/rl-tproxy/rl-tproxy/pkg/exchange"
)

// A listener group is the set of SO_REUSEPORT sockets bound to one address
// (ListenGroup): the kernel spreads the address's connections across them,
// so each event loop accepts on a socket of its own (socket i on loop
// i mod EventLoops, when the group has at least one socket per loop;
// otherwise every loop accepts on every socket).

// ServeGroup serves every listener of lns for svc, as Serve serves one:
// lns is normally one SO_REUSEPORT group from ListenGroup. It returns
// ErrClosed after Shutdown; when one listener fails it closes the others
// and returns that error.
func (p *Proxy) ServeGroup(lns []net.Listener, svc *exchange.Service) error {
	if svc == nil {
		return errors.New("proxy: ServeGroup with nil service")
	}
	return p.serveGroup(lns, pickNamed(svc))
}

// ServeSteeredGroup serves every listener of lns as ServeSteered serves
// one: lns is the SO_REUSEPORT group whose first socket sits in the
// sk_lookup sockmap slot (the kernel's reuseport selection spreads the
// steered connections over the whole group).
func (p *Proxy) ServeSteeredGroup(lns []net.Listener, pick func(cfg *Config, local netip.AddrPort) *exchange.Service) error {
	if pick == nil {
		pick = pickByPort
	}
	return p.serveGroup(lns, pick)
}

func (p *Proxy) serveGroup(lns []net.Listener, pick func(*Config, netip.AddrPort) *exchange.Service) error {
	switch len(lns) {
	case 0:
		return errors.New("proxy: serve an empty listener group")
	case 1:
		return p.serve(lns[0], pick)
	}
	serve := func(_ int, ln net.Listener) error { return p.serve(ln, pick) }
	if p.lg != nil && len(lns) >= p.lg.n {
		// One socket per loop: loop i%n alone accepts on socket i.
		serve = func(i int, ln net.Listener) error { return p.lg.serveOn(ln, pick, i%p.lg.n) }
	}
	errc := make(chan error, len(lns))
	for i, ln := range lns {
		go func() { errc <- serve(i, ln) }()
	}
	var first error
	for range lns {
		if err := <-errc; err != nil && !errors.Is(err, ErrClosed) && first == nil {
			first = err
			closeListeners(lns)
		}
	}
	if first == nil {
		return ErrClosed
	}
	return first
}

// ListenGroupSize is the number of sockets a listener group should have
// for this proxy (ListenAll uses it): one per event loop.
func (p *Proxy) ListenGroupSize() int { return p.lg.n }
