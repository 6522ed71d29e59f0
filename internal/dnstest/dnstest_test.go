package dnstest

import (
	"net/netip"
	"testing"
	"time"

	"github.com/miekg/dns"
)

func query(t *testing.T, addr, name string, qt uint16, network string) *dns.Msg {
	t.Helper()
	c := &dns.Client{Net: network, Timeout: 2 * time.Second}
	m := new(dns.Msg)
	m.SetQuestion(dns.Fqdn(name), qt)
	r, _, err := c.Exchange(m, addr)
	if err != nil {
		t.Fatalf("query %s %s: %v", name, dns.TypeToString[qt], err)
	}
	return r
}

var testTargets = []Target{
	{Name: "n1.rl.test", Port: 7001, Addrs: []netip.Addr{netip.MustParseAddr("127.0.0.1"), netip.MustParseAddr("::1")}},
	{Name: "n2.rl.test", Port: 7002, Priority: 1, Weight: 5, Addrs: []netip.Addr{netip.MustParseAddr("127.0.0.2")}},
}

func TestServerAnswers(t *testing.T) {
	s := Start(t)
	s.SetSRV("_rl._udp.rl.test", testTargets...)
	s.SetTTL(7, 9)
	r := query(t, s.Addr(), "_rl._udp.rl.test", dns.TypeSRV, "udp")
	if r.Rcode != dns.RcodeSuccess || len(r.Answer) != 2 {
		t.Fatalf("SRV answer: %v", r)
	}
	srv := r.Answer[1].(*dns.SRV)
	if srv.Target != "n2.rl.test." || srv.Port != 7002 || srv.Weight != 5 || srv.Hdr.Ttl != 7 {
		t.Errorf("SRV rr = %v", srv)
	}
	if len(r.Extra) != 0 {
		t.Errorf("unexpected glue: %v", r.Extra)
	}
	a := query(t, s.Addr(), "n1.rl.test", dns.TypeA, "udp")
	if len(a.Answer) != 1 || a.Answer[0].(*dns.A).A.String() != "127.0.0.1" || a.Answer[0].Header().Ttl != 9 {
		t.Errorf("A answer: %v", a.Answer)
	}
	aaaa := query(t, s.Addr(), "n1.rl.test", dns.TypeAAAA, "tcp")
	if len(aaaa.Answer) != 1 || aaaa.Answer[0].(*dns.AAAA).AAAA.String() != "::1" {
		t.Errorf("AAAA answer: %v", aaaa.Answer)
	}
	s.SetGlue(true)
	r = query(t, s.Addr(), "_rl._udp.rl.test", dns.TypeSRV, "udp")
	if len(r.Extra) != 3 {
		t.Errorf("glue = %v, want 3 records", r.Extra)
	}
	s.SetTruncateUDP(true)
	r = query(t, s.Addr(), "_rl._udp.rl.test", dns.TypeSRV, "udp")
	if !r.Truncated || len(r.Answer) != 0 {
		t.Errorf("truncated udp answer: %v", r)
	}
	r = query(t, s.Addr(), "_rl._udp.rl.test", dns.TypeSRV, "tcp")
	if r.Truncated || len(r.Answer) != 2 {
		t.Errorf("tcp answer: %v", r)
	}
	if nx := query(t, s.Addr(), "nope.rl.test", dns.TypeSRV, "tcp"); nx.Rcode != dns.RcodeNameError {
		t.Errorf("unknown name rcode = %d", nx.Rcode)
	}
	s.SetSRV("_rl._udp.rl.test")
	if nx := query(t, s.Addr(), "_rl._udp.rl.test", dns.TypeSRV, "tcp"); nx.Rcode != dns.RcodeNameError {
		t.Errorf("removed name rcode = %d", nx.Rcode)
	}
}

func TestServerModes(t *testing.T) {
	s := Start(t)
	s.SetSRV("_rl._udp.rl.test", testTargets...)
	for _, tc := range []struct {
		mode  Mode
		rcode int
		n     int
	}{
		{ModeServFail, dns.RcodeServerFailure, 0},
		{ModeNXDomain, dns.RcodeNameError, 0},
		{ModeRefused, dns.RcodeRefused, 0},
		{ModeNoData, dns.RcodeSuccess, 0},
		{ModeOK, dns.RcodeSuccess, 2},
	} {
		s.SetMode(tc.mode)
		r := query(t, s.Addr(), "_rl._udp.rl.test", dns.TypeSRV, "udp")
		if r.Rcode != tc.rcode || len(r.Answer) != tc.n {
			t.Errorf("mode %d: rcode %d answers %d", tc.mode, r.Rcode, len(r.Answer))
		}
	}
	s.SetMode(ModeDrop)
	c := &dns.Client{Net: "udp", Timeout: 50 * time.Millisecond}
	m := new(dns.Msg)
	m.SetQuestion("_rl._udp.rl.test.", dns.TypeSRV)
	if _, _, err := c.Exchange(m, s.Addr()); err == nil {
		t.Error("ModeDrop answered")
	}
	if s.Queries() < 6 {
		t.Errorf("queries = %d", s.Queries())
	}
}

func TestDnsmasq(t *testing.T) {
	d := StartDnsmasq(t, "_rl._udp.rl.test", 6, testTargets...)
	r := query(t, d.Addr, "_rl._udp.rl.test", dns.TypeSRV, "udp")
	if r.Rcode != dns.RcodeSuccess || len(r.Answer) != 2 {
		t.Fatalf("SRV answer: %v", r)
	}
	a := query(t, d.Addr, "n2.rl.test", dns.TypeA, "udp")
	if len(a.Answer) != 1 || a.Answer[0].(*dns.A).A.String() != "127.0.0.2" {
		t.Errorf("A answer: %v", a)
	}
	t.Logf("dnsmasq SRV TTL %d, A TTL %d", r.Answer[0].Header().Ttl, a.Answer[0].Header().Ttl)
}
