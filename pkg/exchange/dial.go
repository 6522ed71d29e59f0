package exchange

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"time"
)

// Upstream host names are looked up by Config.Resolve and their
// addresses kept for Config.ResolveTTL, by the event loops (each its own)
// and by DialUpstream (one cache for the process). A lookup that fails
// while addresses are known keeps using them and is retried after
// ResolveRetry: a DNS outage does not take the upstream down.

// DefaultResolveTTL is Config.ResolveTTL's default (Go's resolver gives
// no record TTLs).
const DefaultResolveTTL = 5 * time.Second

// ResolveRetry is how soon a failed lookup is retried while the last
// addresses are still in use.
const ResolveRetry = time.Second

// ErrNoAddresses: a lookup answered without a usable address.
var ErrNoAddresses = errors.New("no addresses")

// DialUpstream opens a TCP connection to addr for the paths outside the
// event loops (HTTP/2, TLS passthrough, within ctx's deadline). An IP
// literal is dialled as is; a host name is looked up through a
// process-wide cache, as the loops look up theirs (Resolve, ResolveTTL;
// one lookup at a time per name, the last addresses kept while lookups
// fail), and its addresses are dialled in turn until one connects. Dial
// (or a net.Dialer) opens each connection; a Dial without DialAddrs gets
// addr unchanged.
func (c *Config) DialUpstream(ctx context.Context, addr string) (net.Conn, error) {
	dial := c.Dial
	if dial == nil {
		dial = defaultDialer.DialContext
	} else if !c.DialAddrs {
		return dial(ctx, "tcp", addr)
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil || host == "" {
		return dial(ctx, "tcp", addr)
	}
	if _, err := netip.ParseAddr(host); err == nil {
		return dial(ctx, "tcp", addr)
	}
	ips, err := upstreamNames.lookup(ctx, host, c)
	if err != nil {
		return nil, fmt.Errorf("lookup %s: %w", host, err)
	}
	for _, ip := range ips {
		var nc net.Conn
		if nc, err = dial(ctx, "tcp", net.JoinHostPort(ip.String(), port)); err == nil {
			return nc, nil
		}
		if ctx.Err() != nil {
			break
		}
	}
	return nil, err
}

// nameCache is DialUpstream's process-wide cache of upstream host names.
type nameCache struct {
	mu    sync.Mutex
	m     map[string]*nameEntry
	sweep time.Time // when entries unused for nameIdle are next dropped
}

// nameIdle: an entry whose addresses expired this long ago is dropped
// (names a reload took out of the policy do not stay forever);
// nameSweep is how often the cache looks for such entries. Variables
// for the tests only.
var nameIdle, nameSweep = 10 * time.Minute, time.Minute

// nameEntry is one host name: its addresses, and the lookup in flight.
type nameEntry struct {
	ips   []netip.Addr
	until time.Time
	busy  chan struct{} // closed when the lookup in flight ends; nil: none
}

var upstreamNames = nameCache{m: map[string]*nameEntry{}}

// defaultDialer opens upstream connections when Config.Dial is nil.
var defaultDialer net.Dialer

// lookup returns host's addresses: cached while fresh, else from the
// lookup in flight or a new one (by cfg.Resolve), or the last ones when
// the lookup fails.
func (nc *nameCache) lookup(ctx context.Context, host string, cfg *Config) ([]netip.Addr, error) {
	for {
		nc.mu.Lock()
		if now := time.Now(); !now.Before(nc.sweep) {
			nc.sweep = now.Add(nameSweep)
			for h, e := range nc.m {
				if e.busy == nil && now.After(e.until.Add(nameIdle)) {
					delete(nc.m, h)
				}
			}
		}
		e := nc.m[host]
		if e == nil {
			e = &nameEntry{}
			nc.m[host] = e
		}
		if len(e.ips) > 0 && time.Now().Before(e.until) {
			ips := e.ips
			nc.mu.Unlock()
			return ips, nil
		}
		if busy := e.busy; busy != nil {
			nc.mu.Unlock()
			select {
			case <-busy:
				continue // its answer is in the entry now
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
		e.busy = make(chan struct{})
		nc.mu.Unlock()
		return nc.resolve(ctx, host, e, cfg)
	}
}

// resolve runs one lookup for e and wakes the callers waiting for it.
func (nc *nameCache) resolve(ctx context.Context, host string, e *nameEntry, cfg *Config) ([]netip.Addr, error) {
	lookup := cfg.Resolve
	if lookup == nil {
		lookup = func(ctx context.Context, host string) ([]netip.Addr, error) {
			return net.DefaultResolver.LookupNetIP(ctx, "ip", host)
		}
	}
	found, err := lookup(ctx, host)
	var ips []netip.Addr
	for _, ip := range found {
		if ip = ip.Unmap(); ip.Zone() == "" {
			ips = append(ips, ip)
		}
	}
	if err == nil && len(ips) == 0 {
		err = ErrNoAddresses
	}
	nc.mu.Lock()
	defer nc.mu.Unlock()
	close(e.busy)
	e.busy = nil
	switch {
	case err == nil:
		e.ips, e.until = ips, time.Now().Add(DurationOr(cfg.ResolveTTL, DefaultResolveTTL))
		return ips, nil
	case len(e.ips) > 0 && !errors.Is(err, ErrNoAddresses) && ctx.Err() == nil:
		e.until = time.Now().Add(ResolveRetry) // keep the last addresses a while
		cfg.Log().Warn("upstream lookup failed; using its last addresses", "host", host, "addresses", len(e.ips), "err", err)
		return e.ips, nil
	}
	return nil, err
}
