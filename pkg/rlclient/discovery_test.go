package rlclient

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/rl-tproxy/rl-tproxy/internal/dnstest"
	"github.com/rl-tproxy/rl-tproxy/internal/testkit"
)

func mustResolver(t *testing.T, addr string) *resolver {
	t.Helper()
	r, err := newResolver(addr, 300*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func TestLookupStrict(t *testing.T) {
	v4 := func(s string) []netip.Addr { return []netip.Addr{netip.MustParseAddr(s)} }
	ok := []dnstest.Target{
		{Name: "a.rl.test", Port: 7001, Addrs: v4("127.0.0.1")},
		{Name: "b.rl.test", Port: 7002, Priority: 3, Weight: 9, Addrs: []netip.Addr{netip.MustParseAddr("::1"), netip.MustParseAddr("127.0.0.2")}},
	}
	many := make([]dnstest.Target, MaxEndpoints+1)
	for i := range many {
		many[i] = dnstest.Target{Name: fmt.Sprintf("m%d.rl.test", i), Port: 7000, Addrs: v4(fmt.Sprintf("127.0.1.%d", i+1))}
	}
	tests := []struct {
		name    string
		setup   func(s *dnstest.Server)
		bind    string
		wantErr string
		wantN   int
	}{
		{name: "ok", setup: func(s *dnstest.Server) { s.SetSRV(testSRV, ok...) }, wantN: 3},
		{name: "glue", setup: func(s *dnstest.Server) { s.SetSRV(testSRV, ok...); s.SetGlue(true) }, wantN: 3},
		{name: "tcp after truncation", setup: func(s *dnstest.Server) { s.SetSRV(testSRV, ok...); s.SetTruncateUDP(true) }, wantN: 3},
		{name: "v4 bind skips AAAA", bind: "127.0.0.1", setup: func(s *dnstest.Server) { s.SetSRV(testSRV, ok...) }, wantN: 2},
		{name: "address listed twice is one endpoint", setup: func(s *dnstest.Server) {
			s.SetSRV(testSRV, ok[0], dnstest.Target{Name: "b.rl.test", Port: 7002, Priority: 3, Weight: 9,
				Addrs: []netip.Addr{netip.MustParseAddr("127.0.0.2"), netip.MustParseAddr("127.0.0.2")}})
		}, wantN: 2},
		{name: "v6 bind picks AAAA", bind: "::1", setup: func(s *dnstest.Server) {
			s.SetSRV(testSRV, dnstest.Target{Name: "b.rl.test", Port: 7002, Addrs: []netip.Addr{netip.MustParseAddr("::1"), netip.MustParseAddr("127.0.0.2")}})
		}, wantN: 1},
		{name: "nxdomain", setup: func(s *dnstest.Server) {}, wantErr: "no such name"},
		{name: "servfail", setup: func(s *dnstest.Server) { s.SetSRV(testSRV, ok...); s.SetMode(dnstest.ModeServFail) }, wantErr: "SERVFAIL"},
		{name: "refused", setup: func(s *dnstest.Server) { s.SetMode(dnstest.ModeRefused) }, wantErr: "REFUSED"},
		{name: "empty", setup: func(s *dnstest.Server) { s.SetMode(dnstest.ModeNoData) }, wantErr: "empty answer"},
		{name: "no answer", setup: func(s *dnstest.Server) { s.SetMode(dnstest.ModeDrop) }, wantErr: "timeout"},
		{name: "root target", setup: func(s *dnstest.Server) { s.SetSRV(testSRV, dnstest.Target{Name: ".", Port: 1}) }, wantErr: "not available"},
		{name: "port 0", setup: func(s *dnstest.Server) {
			s.SetSRV(testSRV, dnstest.Target{Name: "a.rl.test", Port: 0, Addrs: v4("127.0.0.1")})
		}, wantErr: "port 0"},
		{name: "no address", setup: func(s *dnstest.Server) { s.SetSRV(testSRV, dnstest.Target{Name: "a.rl.test", Port: 7}) }, wantErr: "no usable address"},
		{name: "unusable address", setup: func(s *dnstest.Server) {
			s.SetSRV(testSRV, dnstest.Target{Name: "a.rl.test", Port: 7, Addrs: v4("0.0.0.0")})
		}, wantErr: "no usable address"},
		{name: "v4 bind, v6 only target", bind: "127.0.0.1", setup: func(s *dnstest.Server) {
			s.SetSRV(testSRV, dnstest.Target{Name: "a.rl.test", Port: 7, Addrs: []netip.Addr{netip.MustParseAddr("::1")}})
		}, wantErr: "no usable address"},
		{name: "duplicate target", setup: func(s *dnstest.Server) { s.SetSRV(testSRV, ok[0], ok[0]) }, wantErr: "duplicate target"},
		{name: "shared address", setup: func(s *dnstest.Server) {
			s.SetSRV(testSRV, ok[0], dnstest.Target{Name: "c.rl.test", Port: 7001, Addrs: v4("127.0.0.1")})
		}, wantErr: "share address"},
		{name: "too many", setup: func(s *dnstest.Server) { s.SetSRV(testSRV, many...) }, wantErr: "at most"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := dnstest.Start(t)
			s.SetTTL(40, 30)
			tc.setup(s)
			var bind netip.Addr
			if tc.bind != "" {
				bind = netip.MustParseAddr(tc.bind)
			}
			eps, ttl, err := mustResolver(t, s.Addr()).lookup(context.Background(), testSRV, bind)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(eps) != tc.wantN || ttl != 30*time.Second {
				t.Fatalf("eps %v ttl %v", eps, ttl)
			}
			switch tc.name {
			case "v6 bind picks AAAA":
				if eps[0].Addr != netip.MustParseAddrPort("[::1]:7002") {
					t.Errorf("addr %v", eps[0].Addr)
				}
			default:
				want := Endpoint{Target: "b.rl.test.", Addr: netip.MustParseAddrPort("127.0.0.2:7002"), Priority: 3, Weight: 9}
				if eps[1] != want || eps[0].Target != "a.rl.test." {
					t.Errorf("eps = %+v", eps)
				}
				if len(eps) == 3 { // every address of b: IPv4 first, then IPv6
					want.Addr = netip.MustParseAddrPort("[::1]:7002")
					if eps[2] != want {
						t.Errorf("eps[2] = %+v, want %+v", eps[2], want)
					}
				}
			}
		})
	}
}

func TestResolverSpec(t *testing.T) {
	r, err := newResolver("127.0.0.1, [::1]:5353,10.0.0.1:53", 0)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(r.servers, " ") != "127.0.0.1:53 [::1]:5353 10.0.0.1:53" || r.timeout != DefaultResolverTimeout {
		t.Errorf("servers %v timeout %v", r.servers, r.timeout)
	}
	for _, bad := range []string{"dns.example", "127.0.0.1:x", ","} {
		if _, err := newResolver(bad, 0); err == nil {
			t.Errorf("resolver %q accepted", bad)
		}
	}
}

func TestResolverFallsThroughServers(t *testing.T) {
	bad := dnstest.Start(t)
	bad.SetMode(dnstest.ModeServFail)
	good := dnstest.Start(t)
	good.SetSRV(testSRV, dnstest.Target{Name: "a.rl.test", Port: 7, Addrs: []netip.Addr{netip.MustParseAddr("127.0.0.1")}})
	eps, _, err := mustResolver(t, bad.Addr()+","+good.Addr()).lookup(context.Background(), testSRV, netip.Addr{})
	if err != nil || len(eps) != 1 {
		t.Fatalf("eps %v err %v", eps, err)
	}
}

func TestRefreshScheduleAndLastKnownGood(t *testing.T) {
	s := dnstest.Start(t)
	s.SetSRV(testSRV, dnstest.Target{Name: "a.rl.test", Port: 7, Addrs: []netip.Addr{netip.MustParseAddr("127.0.0.1")}})
	clk := newManualClock(time.Unix(1_000_000, 0))
	d := newDiscovery(testSRV, netip.Addr{}, mustResolver(t, s.Addr()), clk, slog.New(slog.DiscardHandler))
	fails := 0
	for _, tc := range []struct {
		ttl  uint32
		want time.Duration
	}{{1, MinRefresh}, {60, time.Minute}, {3600, MaxRefresh}} {
		s.SetTTL(tc.ttl, tc.ttl)
		if got := d.refresh(&fails); got != tc.want {
			t.Errorf("ttl %ds: next refresh %v, want %v", tc.ttl, got, tc.want)
		}
	}
	first := d.current()
	s.SetMode(dnstest.ModeServFail)
	var delays []time.Duration
	for i := 0; i < 6; i++ {
		delays = append(delays, d.refresh(&fails))
		if d.current() != first {
			t.Fatal("last-known-good dropped early")
		}
	}
	want := []time.Duration{500 * time.Millisecond, time.Second, 2 * time.Second, 4 * time.Second, RetryMax, RetryMax}
	if fmt.Sprint(delays) != fmt.Sprint(want) {
		t.Errorf("retry delays %v, want %v", delays, want)
	}
	// Near the end of the last-known-good period the retry lands on its end.
	clk.Advance(LastKnownGood - time.Second)
	if got := d.refresh(&fails); got != time.Second || d.current() == nil {
		t.Errorf("retry %v (membership %v), want 1s and still present", got, d.current())
	}
	clk.Advance(time.Second)
	d.refresh(&fails)
	if d.current() != nil || d.expired.Load() != 1 {
		t.Fatal("last-known-good not dropped after its period")
	}
	s.SetMode(dnstest.ModeOK)
	if d.refresh(&fails); d.current() == nil || fails != 0 {
		t.Fatal("no recovery")
	}
}

func TestClientDNSFailureAtStart(t *testing.T) {
	s := dnstest.Start(t)
	s.SetMode(dnstest.ModeServFail)
	c := newTestClient(t, s.Addr(), clientOpts{})
	testkit.WaitFor(t, "a failed lookup", func() bool { return c.Stats().LookupFailures >= 1 })
	var dec Decision
	if err := c.Check(context.Background(), testRequest(), &dec); err != ErrNoEndpoints || dec.Cause != CauseNoEndpoints {
		t.Fatalf("err %v decision %+v", err, dec)
	}
	if c.Ready() || c.DiscoveryError() == nil {
		t.Errorf("ready %v error %v", c.Ready(), c.DiscoveryError())
	}
}

func TestClientMembershipChangeAfterTTL(t *testing.T) {
	d, nodes := fakeCluster(t, 3)
	d.SetTTL(6, 6)
	d.SetSRV(testSRV, targetsFor(nodes[0].addr())...)
	clk := newManualClock(time.Now())
	c := newTestClient(t, d.Addr(), clientOpts{clock: clk})
	waitReady(t, c)
	if n := len(c.Endpoints()); n != 1 {
		t.Fatalf("endpoints %d", n)
	}
	d.SetSRV(testSRV, targetsFor(nodes[0].addr(), nodes[1].addr(), nodes[2].addr())...)
	lookups := c.Stats().Lookups
	clk.Advance(6 * time.Second)
	testkit.WaitFor(t, "refresh after TTL", func() bool { return len(c.Endpoints()) == 3 })
	if c.Stats().Lookups != lookups+1 {
		t.Errorf("lookups %d -> %d", lookups, c.Stats().Lookups)
	}
	var dec Decision
	for i := 0; i < 5; i++ {
		if err := c.Check(context.Background(), testRequest(), &dec); err != nil {
			t.Fatal(err)
		}
	}
	testkit.WaitFor(t, "all nodes used", func() bool {
		return nodes[1].count(1) > 0 && nodes[2].count(1) > 0
	})
}

func TestClientDNSFailureAfterStartUsesLastKnownGood(t *testing.T) {
	d, _ := fakeCluster(t, 2)
	d.SetTTL(5, 5)
	clk := newManualClock(time.Now())
	c := newTestClient(t, d.Addr(), clientOpts{clock: clk})
	waitReady(t, c)
	d.SetMode(dnstest.ModeServFail)
	clk.Advance(5 * time.Second)
	testkit.WaitFor(t, "failed refresh", func() bool { return c.Stats().LookupFailures >= 1 })
	var dec Decision
	if err := c.Check(context.Background(), testRequest(), &dec); err != nil || dec.Cause != CauseAllow {
		t.Fatalf("with last-known-good: err %v decision %+v", err, dec)
	}
	clk.Advance(LastKnownGood)
	testkit.WaitFor(t, "expiry", func() bool { return c.Stats().LKGExpired == 1 })
	if err := c.Check(context.Background(), testRequest(), &dec); err != ErrNoEndpoints {
		t.Fatalf("after expiry: %v", err)
	}
}
