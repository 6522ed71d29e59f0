package proxy

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"time"

	"golang.org/x/sys/unix"

	"github.com/rl-tproxy/rl-tproxy/pkg/exchange"
)

// Host-name upstreams on the event loops. A loop resolves an upstream's
// name itself, off the loop (one lookup at a time per name and loop; the
// requests that need it meanwhile wait for that one), keeps the addresses
// for ResolveTTL and connects to them non-blocking, trying the next
// address when a connect fails, as net.Dialer does. A lookup that fails
// while addresses are known keeps using them and retries after
// exchange.ResolveRetry: a DNS outage does not take the upstream down.

// hostAddrs is one loop's view of an upstream host name.
type hostAddrs struct {
	host string // immutable: read by the lookup goroutine
	port uint16

	addrs []netip.AddrPort
	sas   []unix.Sockaddr // per address, this loop's own (Connect writes into it)
	fams  []int
	until int64 // loop clock: addrs are fresh before it
	next  int   // where the next connection starts in addrs (round robin)

	resolving bool
	waiting   []*upstreamConn // connections waiting for the lookup
}

// newHostAddrs returns the resolution state of addr ("host:port" with a
// host name), or nil when addr has no host name and port.
func newHostAddrs(addr string) *hostAddrs {
	host, port, err := net.SplitHostPort(addr)
	if err != nil || host == "" {
		return nil
	}
	if _, err := netip.ParseAddr(host); err == nil {
		return nil // an IP literal the pool could not use (an IPv6 zone): dialled
	}
	p, err := strconv.ParseUint(port, 10, 16)
	if err != nil {
		return nil
	}
	return &hostAddrs{host: host, port: uint16(p)}
}

// set takes a lookup's answer.
func (h *hostAddrs) set(ips []netip.Addr, now int64, ttl time.Duration) {
	h.addrs, h.sas, h.fams = h.addrs[:0], h.sas[:0], h.fams[:0]
	for _, ip := range ips {
		ip = ip.Unmap()
		switch {
		case ip.Is4():
			h.sas = append(h.sas, &unix.SockaddrInet4{Port: int(h.port), Addr: ip.As4()})
			h.fams = append(h.fams, unix.AF_INET)
		case ip.Is6() && ip.Zone() == "":
			h.sas = append(h.sas, &unix.SockaddrInet6{Port: int(h.port), Addr: ip.As16()})
			h.fams = append(h.fams, unix.AF_INET6)
		default:
			continue
		}
		h.addrs = append(h.addrs, netip.AddrPortFrom(ip, h.port))
	}
	h.until = now + int64(ttl)
}

// connectHost opens u to its pool's host name: at once when its
// addresses are fresh, else once the lookup answered.
func (u *upstreamConn) connectHost(cfg *Config, timeout time.Duration) {
	h := u.pool.h
	if u.ls.l.Now() < h.until && len(h.addrs) > 0 {
		u.startHost(cfg.DialPrep)
		return
	}
	u.dialing = true // the lookup owns u until it answered (close defers to it)
	h.waiting = append(h.waiting, u)
	if !h.resolving {
		u.ls.resolve(h, cfg, timeout)
	}
}

// startHost starts u's connect at the host's next address in turn.
func (u *upstreamConn) startHost(prep func(int, netip.AddrPort) (func(), error)) {
	h := u.pool.h
	u.hostFirst, u.hostTries = h.next, 0
	h.next++
	if err := u.connectNextHost(prep); err != nil {
		u.dialFailed(err)
	}
}

// connectNextHost starts a connect to the first of the host's addresses
// u has not tried; the error when none could start.
func (u *upstreamConn) connectNextHost(prep func(int, netip.AddrPort) (func(), error)) error {
	h := u.pool.h
	err := fmt.Errorf("dial upstream %s: %w", u.pool.addr, exchange.ErrNoAddresses)
	for u.hostTries < len(h.addrs) {
		i := (u.hostFirst + u.hostTries) % len(h.addrs)
		u.hostTries++
		if err = u.connectTo(prep, h.fams[i], h.sas[i], h.addrs[i]); err == nil {
			return nil
		}
	}
	return err
}

// retryHost, after u's connect failed, starts one to the host's next
// address; false when u has no client or no address is left.
func (u *upstreamConn) retryHost() bool {
	h := u.pool.h
	if h == nil || u.c == nil || u.c.r == nil || u.c.r.up != u || u.hostTries >= len(h.addrs) {
		return false
	}
	if err := u.connectNextHost(u.c.r.cfg.DialPrep); err != nil {
		return false
	}
	return true
}

// resolve looks h's name up on a goroutine and hands the answer to the
// loop.
func (ls *loopState) resolve(h *hostAddrs, cfg *Config, timeout time.Duration) {
	h.resolving = true
	lookup := cfg.Resolve
	if lookup == nil {
		lookup = func(ctx context.Context, host string) ([]netip.Addr, error) {
			return net.DefaultResolver.LookupNetIP(ctx, "ip", host)
		}
	}
	ttl := exchange.DurationOr(cfg.ResolveTTL, exchange.DefaultResolveTTL)
	prep := cfg.DialPrep
	l, lg := ls.l, ls.lg
	lg.workers.busy.Add(1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		ips, err := lookup(ctx, h.host)
		cancel()
		l.Post(func() {
			lg.workers.busy.Add(-1)
			ls.resolved(h, ips, err, ttl, prep)
		})
	}()
}

// resolved takes a lookup's answer on the loop and starts (or fails) the
// connections that waited for it.
func (ls *loopState) resolved(h *hostAddrs, ips []netip.Addr, err error, ttl time.Duration, prep func(int, netip.AddrPort) (func(), error)) {
	h.resolving = false
	now := ls.l.Now()
	ls.p.lookups.Add(1)
	if err == nil {
		h.set(ips, now, ttl)
		if len(h.addrs) == 0 {
			err = exchange.ErrNoAddresses
		}
	}
	if err != nil {
		ls.p.lookupErrs.Add(1)
	}
	// An answer without a usable address cleared the list (set): only
	// an error keeps the last addresses.
	if err != nil && len(h.addrs) > 0 {
		h.until = now + int64(exchange.ResolveRetry) // keep the last addresses a while
		ls.p.cfg.Load().Log().Warn("upstream lookup failed; using its last addresses",
			"host", h.host, "addresses", len(h.addrs), "err", err)
		err = nil
	}
	waiting := h.waiting
	h.waiting = nil
	for _, u := range waiting {
		u.dialing = false
		switch {
		case u.c == nil: // the client went away meanwhile
			u.dialFailed(nil)
		case err != nil:
			u.dialFailed(fmt.Errorf("dial upstream %s: lookup %s: %w", u.pool.addr, h.host, err))
		default:
			u.startHost(prep)
		}
	}
}
