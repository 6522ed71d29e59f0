package rlclient

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/miekg/dns"
)

// Discovery timing. The membership is refreshed when its TTL (the smallest
// TTL of the SRV and address records) expires, clamped to
// [MinRefresh, MaxRefresh]. A failed lookup is retried after RetryMin,
// doubling up to RetryMax. Through failures the last successful membership
// stays in use for LastKnownGood after it was fetched; after that the
// client has no endpoints (CauseNoEndpoints) until a lookup succeeds.
const (
	MinRefresh    = 5 * time.Second
	MaxRefresh    = 5 * time.Minute
	RetryMin      = 500 * time.Millisecond
	RetryMax      = 5 * time.Second
	LastKnownGood = 10 * time.Minute
	// MaxEndpoints is the largest accepted membership.
	MaxEndpoints = 32
	// DefaultResolverTimeout bounds one DNS exchange.
	DefaultResolverTimeout = 2 * time.Second
)

// Endpoint is one address of a RateLimitly server: its SRV target and one
// of the target's A/AAAA addresses with the SRV port. A target with several
// addresses is several endpoints, each sent every request.
type Endpoint struct {
	Target   string         // SRV target name, fully qualified, lower case
	Addr     netip.AddrPort // one address of the target and the SRV port
	Priority uint16
	Weight   uint16
}

// endpoint is an Endpoint plus what the client learned about it; the state
// survives refreshes while target and address stay the same.
type endpoint struct {
	Endpoint
	epoch  atomic.Uint64 // latest server_epoch seen (0 = unknown)
	health health
	chosen atomic.Uint64 // decisions taken with this endpoint's answer
}

// membership is one immutable discovery result.
type membership struct {
	eps     []*endpoint
	fetched time.Time
	ttl     time.Duration
}

func (m *membership) indexOf(from netip.AddrPort) int {
	from = netip.AddrPortFrom(from.Addr().Unmap(), from.Port())
	for i, e := range m.eps {
		if e.Addr == from {
			return i
		}
	}
	return -1
}

// resolver sends DNS queries to the configured servers in order.
type resolver struct {
	servers []string
	timeout time.Duration
	udp     dns.Client
	tcp     dns.Client
	// ex replaces exchange when set (fuzzing feeds messages without a
	// network).
	ex func(ctx context.Context, name string, qtype uint16) (*dns.Msg, error)
}

func newResolver(spec string, timeout time.Duration) (*resolver, error) {
	if timeout <= 0 {
		timeout = DefaultResolverTimeout
	}
	r := &resolver{timeout: timeout}
	r.udp = dns.Client{Net: "udp", Timeout: timeout}
	r.tcp = dns.Client{Net: "tcp", Timeout: timeout}
	if spec == "" {
		cc, err := dns.ClientConfigFromFile("/etc/resolv.conf")
		if err != nil {
			return nil, fmt.Errorf("resolver: read /etc/resolv.conf: %w", err)
		}
		for _, s := range cc.Servers {
			r.servers = append(r.servers, net.JoinHostPort(s, cc.Port))
		}
		if len(r.servers) == 0 {
			return nil, errors.New("resolver: /etc/resolv.conf lists no nameserver")
		}
		return r, nil
	}
	for _, s := range strings.Split(spec, ",") {
		s = strings.TrimSpace(s)
		if ap, err := netip.ParseAddrPort(s); err == nil {
			r.servers = append(r.servers, ap.String())
			continue
		}
		if a, err := netip.ParseAddr(s); err == nil {
			r.servers = append(r.servers, netip.AddrPortFrom(a, 53).String())
			continue
		}
		return nil, fmt.Errorf("resolver %q: want IP or IP:port (comma separated)", s)
	}
	return r, nil
}

// exchange asks each server in turn; a truncated UDP answer is retried
// over TCP. NXDOMAIN is final; other failures try the next server.
func (r *resolver) exchange(ctx context.Context, name string, qtype uint16) (*dns.Msg, error) {
	if r.ex != nil {
		return r.ex(ctx, name, qtype)
	}
	q := new(dns.Msg)
	q.SetQuestion(name, qtype)
	q.RecursionDesired = true
	var lastErr error
	for _, srv := range r.servers {
		resp, _, err := r.udp.ExchangeContext(ctx, q, srv)
		if err == nil && resp.Truncated {
			resp, _, err = r.tcp.ExchangeContext(ctx, q, srv)
		}
		if err != nil {
			lastErr = fmt.Errorf("%s %s via %s: %w", dns.TypeToString[qtype], name, srv, err)
			if ctx.Err() != nil {
				return nil, lastErr
			}
			continue
		}
		switch resp.Rcode {
		case dns.RcodeSuccess:
			return resp, nil
		case dns.RcodeNameError:
			return resp, nil
		default:
			lastErr = fmt.Errorf("%s %s via %s: rcode %s", dns.TypeToString[qtype], name, srv, dns.RcodeToString[resp.Rcode])
		}
	}
	return nil, lastErr
}

// lookup resolves the SRV name into a strict membership: every target must
// be a proper name with a nonzero port and at least one usable address of a
// family the bind address can reach; each of its addresses is an endpoint;
// targets must be unique and no address may belong to two targets.
func (r *resolver) lookup(ctx context.Context, srvName string, bind netip.Addr) ([]Endpoint, time.Duration, error) {
	name := dns.Fqdn(srvName)
	resp, err := r.exchange(ctx, name, dns.TypeSRV)
	if err != nil {
		return nil, 0, err
	}
	if resp.Rcode == dns.RcodeNameError {
		return nil, 0, fmt.Errorf("SRV %s: no such name", name)
	}
	owners := map[string]bool{strings.ToLower(name): true}
	for _, rr := range resp.Answer { // follow CNAMEs inside the answer
		if c, ok := rr.(*dns.CNAME); ok && owners[strings.ToLower(c.Hdr.Name)] {
			owners[strings.ToLower(c.Target)] = true
		}
	}
	ttl := time.Duration(1<<63 - 1)
	minTTL := func(s uint32) {
		if d := time.Duration(s) * time.Second; d < ttl {
			ttl = d
		}
	}
	var srvs []*dns.SRV
	for _, rr := range resp.Answer {
		if s, ok := rr.(*dns.SRV); ok && owners[strings.ToLower(s.Hdr.Name)] {
			srvs = append(srvs, s)
			minTTL(s.Hdr.Ttl)
		}
	}
	if len(srvs) == 0 {
		return nil, 0, fmt.Errorf("SRV %s: empty answer", name)
	}
	if len(srvs) > MaxEndpoints {
		return nil, 0, fmt.Errorf("SRV %s: %d targets, at most %d supported", name, len(srvs), MaxEndpoints)
	}
	glue := make(map[string][]dns.RR)
	for _, rr := range resp.Extra {
		switch rr.(type) {
		case *dns.A, *dns.AAAA:
			k := strings.ToLower(rr.Header().Name)
			glue[k] = append(glue[k], rr)
		}
	}
	want4 := !bind.IsValid() || bind.Unmap().Is4() || bind.IsUnspecified()
	want6 := !bind.IsValid() || (bind.Is6() && !bind.Is4In6())
	var eps []Endpoint
	seenTarget := make(map[string]bool)
	seenAddr := make(map[netip.AddrPort]string)
	for _, s := range srvs {
		target := strings.ToLower(s.Target)
		if target == "." || target == "" {
			return nil, 0, fmt.Errorf("SRV %s: target %q means the service is not available", name, s.Target)
		}
		if _, ok := dns.IsDomainName(target); !ok {
			return nil, 0, fmt.Errorf("SRV %s: invalid target %q", name, s.Target)
		}
		if s.Port == 0 {
			return nil, 0, fmt.Errorf("SRV %s: target %s has port 0", name, target)
		}
		key := target + ":" + strconv.Itoa(int(s.Port))
		if seenTarget[key] {
			return nil, 0, fmt.Errorf("SRV %s: duplicate target %s", name, key)
		}
		seenTarget[key] = true
		addrs, err := r.targetAddrs(ctx, target, glue[target], want4, want6, minTTL)
		if err != nil {
			return nil, 0, fmt.Errorf("SRV %s target %s: %w", name, target, err)
		}
		if len(addrs) == 0 {
			return nil, 0, fmt.Errorf("SRV %s: target %s has no usable address", name, target)
		}
		for _, addr := range addrs {
			ap := netip.AddrPortFrom(addr, s.Port)
			if other, dup := seenAddr[ap]; dup {
				if other == target {
					continue // the same address listed twice for one target
				}
				return nil, 0, fmt.Errorf("SRV %s: targets %s and %s share address %s", name, other, target, ap)
			}
			seenAddr[ap] = target
			eps = append(eps, Endpoint{Target: target, Addr: ap, Priority: s.Priority, Weight: s.Weight})
		}
	}
	if len(eps) > MaxEndpoints {
		return nil, 0, fmt.Errorf("SRV %s: %d endpoint addresses, at most %d supported", name, len(eps), MaxEndpoints)
	}
	return eps, ttl, nil
}

// targetAddrs is every usable address of target, IPv4 ones first, in
// answer order: from glue when the SRV answer carried some, else from A
// and AAAA lookups (of the families wanted).
func (r *resolver) targetAddrs(ctx context.Context, target string, rrs []dns.RR, want4, want6 bool, minTTL func(uint32)) ([]netip.Addr, error) {
	if len(rrs) == 0 {
		for _, qt := range []uint16{dns.TypeA, dns.TypeAAAA} {
			if (qt == dns.TypeA && !want4) || (qt == dns.TypeAAAA && !want6) {
				continue
			}
			ar, err := r.exchange(ctx, target, qt)
			if err != nil {
				return nil, err
			}
			rrs = append(rrs, ar.Answer...)
		}
	}
	var v4, v6 []netip.Addr
	for _, rr := range rrs {
		if !strings.EqualFold(rr.Header().Name, target) {
			continue
		}
		switch a := rr.(type) {
		case *dns.A:
			if ip, ok := netip.AddrFromSlice(a.A); ok && usable(ip.Unmap()) && want4 {
				v4 = append(v4, ip.Unmap())
				minTTL(a.Hdr.Ttl)
			}
		case *dns.AAAA:
			if ip, ok := netip.AddrFromSlice(a.AAAA); ok && usable(ip) && !ip.Is4In6() && want6 {
				v6 = append(v6, ip)
				minTTL(a.Hdr.Ttl)
			}
		}
	}
	return append(v4, v6...), nil
}

func usable(a netip.Addr) bool {
	return a.IsValid() && !a.IsUnspecified() && !a.IsMulticast()
}

func clampRefresh(ttl time.Duration) time.Duration {
	switch {
	case ttl < MinRefresh:
		return MinRefresh
	case ttl > MaxRefresh:
		return MaxRefresh
	}
	return ttl
}

// discovery runs lookups in its own goroutine and publishes memberships.
type discovery struct {
	name  string
	bind  netip.Addr
	res   *resolver
	clock Clock
	log   *slog.Logger

	cur      atomic.Pointer[membership]
	ready    atomic.Bool
	lookups  atomic.Uint64
	failures atomic.Uint64
	expired  atomic.Uint64
	mu       sync.Mutex
	lastErr  error

	ctx    context.Context
	cancel context.CancelFunc
	done   chan struct{}
}

func newDiscovery(name string, bind netip.Addr, res *resolver, clock Clock, lg *slog.Logger) *discovery {
	ctx, cancel := context.WithCancel(context.Background())
	return &discovery{name: name, bind: bind, res: res, clock: clock, log: lg, ctx: ctx, cancel: cancel, done: make(chan struct{})}
}

func (d *discovery) start() { go d.run() }

func (d *discovery) stop() {
	d.cancel()
	<-d.done
}

// current is the membership to use now (nil = none).
func (d *discovery) current() *membership { return d.cur.Load() }

func (d *discovery) err() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.lastErr
}

func (d *discovery) run() {
	defer close(d.done)
	t := d.clock.NewTimer(time.Hour)
	defer t.Stop()
	fails := 0
	for {
		next := d.refresh(&fails)
		t.ResetAt(d.clock.Now().Add(next))
		select {
		case <-d.ctx.Done():
			return
		case <-t.C():
		}
	}
}

// refresh performs one lookup and returns the delay until the next one.
func (d *discovery) refresh(fails *int) time.Duration {
	d.lookups.Add(1)
	eps, ttl, err := d.res.lookup(d.ctx, d.name, d.bind)
	now := d.clock.Now()
	if err != nil {
		if d.ctx.Err() != nil {
			return time.Hour
		}
		*fails++
		d.failures.Add(1)
		d.mu.Lock()
		d.lastErr = err
		d.mu.Unlock()
		cur := d.cur.Load()
		if cur != nil && now.Sub(cur.fetched) >= LastKnownGood {
			d.cur.Store(nil)
			d.expired.Add(1)
			d.log.Error("rlclient: discovery failing and last-known-good membership expired", "srv", d.name, "err", err, "age", now.Sub(cur.fetched))
		} else {
			d.log.Warn("rlclient: discovery lookup failed", "srv", d.name, "err", err, "have_last_known_good", cur != nil)
		}
		back := RetryMin << min(*fails-1, 8)
		if back > RetryMax {
			back = RetryMax
		}
		if cur != nil {
			if left := cur.fetched.Add(LastKnownGood).Sub(now); left > 0 && left < back {
				back = left
			}
		}
		return back
	}
	*fails = 0
	d.mu.Lock()
	d.lastErr = nil
	d.mu.Unlock()
	d.publish(eps, ttl, now)
	return clampRefresh(ttl)
}

func (d *discovery) publish(eps []Endpoint, ttl time.Duration, now time.Time) {
	prev := d.cur.Load()
	m := &membership{fetched: now, ttl: ttl, eps: make([]*endpoint, len(eps))}
	changed := prev == nil || len(prev.eps) != len(eps)
	for i, e := range eps {
		var ep *endpoint
		if prev != nil {
			for _, p := range prev.eps {
				if p.Endpoint == e {
					ep = p // same server: keep what we learned (epoch)
					break
				}
				if p.Target == e.Target && p.Addr == e.Addr {
					ep = &endpoint{Endpoint: e}
					ep.epoch.Store(p.epoch.Load())
					ep.health.pending.Store(p.health.pending.Load())
					ep.health.since.Store(p.health.since.Load())
					ep.chosen.Store(p.chosen.Load())
					break
				}
			}
		}
		if ep == nil {
			ep = &endpoint{Endpoint: e}
			changed = true
		}
		m.eps[i] = ep
	}
	d.cur.Store(m)
	d.ready.Store(true)
	if changed {
		d.log.Info("rlclient: membership", "srv", d.name, "endpoints", len(eps), "ttl", ttl)
	}
}
