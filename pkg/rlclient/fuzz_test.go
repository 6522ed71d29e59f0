package rlclient

import (
	"context"
	"errors"
	"net/netip"
	"testing"

	"github.com/miekg/dns"
)

// FuzzSRVMembership feeds arbitrary DNS messages as the SRV answer (A/AAAA
// queries get empty answers, so only glue can supply addresses) and checks
// that discovery either rejects them or yields a strict membership.
func FuzzSRVMembership(f *testing.F) {
	for _, m := range seedSRVMessages() {
		b, err := m.Pack()
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		msg := new(dns.Msg)
		if msg.Unpack(data) != nil {
			return
		}
		r := &resolver{ex: func(_ context.Context, name string, qt uint16) (*dns.Msg, error) {
			if qt != dns.TypeSRV {
				empty := new(dns.Msg)
				empty.SetQuestion(name, qt)
				return empty, nil
			}
			if msg.Rcode != dns.RcodeSuccess && msg.Rcode != dns.RcodeNameError {
				return nil, errors.New("rcode")
			}
			return msg, nil
		}}
		eps, ttl, err := r.lookup(context.Background(), "_rl._udp.rl.test", netip.Addr{})
		if err != nil {
			return
		}
		if len(eps) == 0 || len(eps) > MaxEndpoints || ttl < 0 {
			t.Fatalf("accepted %d endpoints ttl %v", len(eps), ttl)
		}
		targets := map[string]bool{}
		addrs := map[netip.AddrPort]bool{}
		for _, e := range eps {
			if !e.Addr.IsValid() || e.Addr.Port() == 0 || !usable(e.Addr.Addr()) || e.Target == "" || e.Target == "." {
				t.Fatalf("bad endpoint %+v", e)
			}
			if addrs[e.Addr] {
				t.Fatalf("duplicate address %v", e.Addr)
			}
			addrs[e.Addr] = true
			targets[e.Target] = true
		}
	})
}

func seedSRVMessages() []*dns.Msg {
	name := "_rl._udp.rl.test."
	mk := func(glue bool, targets ...string) *dns.Msg {
		m := new(dns.Msg)
		m.SetQuestion(name, dns.TypeSRV)
		m.Response = true
		for i, tg := range targets {
			m.Answer = append(m.Answer, &dns.SRV{Hdr: dns.RR_Header{Name: name, Rrtype: dns.TypeSRV, Class: dns.ClassINET, Ttl: 30},
				Port: uint16(7000 + i), Target: tg})
			if glue {
				m.Extra = append(m.Extra, &dns.A{Hdr: dns.RR_Header{Name: tg, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 20},
					A: []byte{127, 0, 0, byte(i + 1)}})
				m.Extra = append(m.Extra, &dns.AAAA{Hdr: dns.RR_Header{Name: tg, Rrtype: dns.TypeAAAA, Class: dns.ClassINET, Ttl: 20},
					AAAA: netip.MustParseAddr("::1").AsSlice()})
			}
		}
		return m
	}
	nx := mk(false)
	nx.Rcode = dns.RcodeNameError
	cname := mk(true, "a.rl.test.")
	cname.Answer = append([]dns.RR{&dns.CNAME{Hdr: dns.RR_Header{Name: name, Rrtype: dns.TypeCNAME, Class: dns.ClassINET, Ttl: 5}, Target: name}}, cname.Answer...)
	return []*dns.Msg{mk(true, "a.rl.test.", "b.rl.test.", "c.rl.test."), mk(false, "a.rl.test."), mk(true, "."), mk(true, "a.rl.test.", "a.rl.test."), nx, cname}
}

// FuzzResolverSpec checks the resolver list parser: it never panics and
// every accepted server is an IP:port.
func FuzzResolverSpec(f *testing.F) {
	for _, s := range []string{"127.0.0.1", "127.0.0.1:5353", "[::1]:53,10.0.0.2", "dns.example", " 1.2.3.4 , [fe80::1%eth0]:53", ","} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, spec string) {
		if spec == "" {
			return // "" reads /etc/resolv.conf
		}
		r, err := newResolver(spec, 0)
		if err != nil {
			return
		}
		if len(r.servers) == 0 {
			t.Fatal("accepted a spec with no server")
		}
		for _, s := range r.servers {
			if _, err := netip.ParseAddrPort(s); err != nil {
				t.Fatalf("accepted server %q: %v", s, err)
			}
		}
	})
}
