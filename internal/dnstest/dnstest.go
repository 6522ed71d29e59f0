// Package dnstest runs real DNS servers for tests: an in-process
// github.com/miekg/dns server on loopback (UDP and TCP on one port) that
// answers SRV and A/AAAA queries from a mutable zone with settable TTLs,
// membership changes and failure modes, and a launcher for dnsmasq serving
// the same kind of zone for integration tests.
package dnstest

import (
	"fmt"
	"net"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/miekg/dns"
)

// Target is one SRV target with its addresses.
type Target struct {
	Name     string // host name (made fully qualified)
	Port     uint16
	Priority uint16
	Weight   uint16
	Addrs    []netip.Addr // A/AAAA records
}

// Mode selects how the server answers.
type Mode int

// Failure modes.
const (
	ModeOK       Mode = iota // answer from the zone
	ModeServFail             // SERVFAIL to everything
	ModeNXDomain             // NXDOMAIN to everything
	ModeNoData               // NOERROR with an empty answer to everything
	ModeDrop                 // never answer (client times out)
	ModeRefused              // REFUSED to everything
)

// Server is an in-process authoritative DNS server for tests.
type Server struct {
	addr    string
	udp     *dns.Server
	tcp     *dns.Server
	mu      sync.Mutex
	srv     map[string][]Target // fqdn (lower case) -> targets
	srvTTL  uint32
	addrTTL uint32
	glue    bool
	truncUD bool
	mode    Mode
	queries atomic.Uint64
}

// Start starts a server on 127.0.0.1 (UDP and TCP on the same port) and
// stops it when the test ends.
func Start(t testing.TB) *Server {
	t.Helper()
	s := &Server{srv: make(map[string][]Target), srvTTL: 30, addrTTL: 30}
	var pc net.PacketConn
	var ln net.Listener
	var err error
	for i := 0; i < 20; i++ {
		pc, err = net.ListenPacket("udp4", "127.0.0.1:0")
		if err != nil {
			t.Fatalf("dnstest: listen udp: %v", err)
		}
		ln, err = net.Listen("tcp4", pc.LocalAddr().String())
		if err == nil {
			break
		}
		pc.Close()
	}
	if err != nil {
		t.Fatalf("dnstest: listen tcp: %v", err)
	}
	s.addr = pc.LocalAddr().String()
	h := dns.HandlerFunc(s.serve)
	udpUp, tcpUp := make(chan struct{}), make(chan struct{})
	s.udp = &dns.Server{PacketConn: pc, Handler: h, NotifyStartedFunc: func() { close(udpUp) }}
	s.tcp = &dns.Server{Listener: ln, Handler: h, NotifyStartedFunc: func() { close(tcpUp) }}
	go s.udp.ActivateAndServe()
	go s.tcp.ActivateAndServe()
	<-udpUp
	<-tcpUp
	t.Cleanup(s.Close)
	return s
}

// Addr is the server's "127.0.0.1:port".
func (s *Server) Addr() string { return s.addr }

// Close stops the server. Idempotent.
func (s *Server) Close() {
	s.udp.Shutdown()
	s.tcp.Shutdown()
}

// SetSRV replaces the targets of an SRV name (an empty list removes it).
func (s *Server) SetSRV(name string, targets ...Target) {
	s.mu.Lock()
	defer s.mu.Unlock()
	key := strings.ToLower(dns.Fqdn(name))
	if len(targets) == 0 {
		delete(s.srv, key)
		return
	}
	s.srv[key] = append([]Target(nil), targets...)
}

// SetTTL sets the TTL of SRV and of A/AAAA answers.
func (s *Server) SetTTL(srvTTL, addrTTL uint32) {
	s.mu.Lock()
	s.srvTTL, s.addrTTL = srvTTL, addrTTL
	s.mu.Unlock()
}

// SetGlue makes SRV answers carry the targets' A/AAAA records in the
// additional section.
func (s *Server) SetGlue(on bool) {
	s.mu.Lock()
	s.glue = on
	s.mu.Unlock()
}

// SetTruncateUDP makes every UDP answer empty with the TC bit set, so
// clients must retry over TCP.
func (s *Server) SetTruncateUDP(on bool) {
	s.mu.Lock()
	s.truncUD = on
	s.mu.Unlock()
}

// SetMode selects a failure mode (ModeOK answers normally).
func (s *Server) SetMode(m Mode) {
	s.mu.Lock()
	s.mode = m
	s.mu.Unlock()
}

// Queries is the number of queries received.
func (s *Server) Queries() uint64 { return s.queries.Load() }

func (s *Server) serve(w dns.ResponseWriter, q *dns.Msg) {
	s.queries.Add(1)
	s.mu.Lock()
	defer s.mu.Unlock()
	m := new(dns.Msg)
	m.SetReply(q)
	m.Authoritative = true
	switch s.mode {
	case ModeDrop:
		return
	case ModeServFail:
		m.Rcode = dns.RcodeServerFailure
		w.WriteMsg(m)
		return
	case ModeNXDomain:
		m.Rcode = dns.RcodeNameError
		w.WriteMsg(m)
		return
	case ModeRefused:
		m.Rcode = dns.RcodeRefused
		w.WriteMsg(m)
		return
	case ModeNoData:
		w.WriteMsg(m)
		return
	}
	if len(q.Question) != 1 {
		m.Rcode = dns.RcodeFormatError
		w.WriteMsg(m)
		return
	}
	if s.truncUD && w.LocalAddr().Network() == "udp" {
		m.Truncated = true
		w.WriteMsg(m)
		return
	}
	qq := q.Question[0]
	name := strings.ToLower(qq.Name)
	known := false
	switch qq.Qtype {
	case dns.TypeSRV:
		if targets, ok := s.srv[name]; ok {
			known = true
			for _, tg := range targets {
				m.Answer = append(m.Answer, &dns.SRV{
					Hdr:      dns.RR_Header{Name: qq.Name, Rrtype: dns.TypeSRV, Class: dns.ClassINET, Ttl: s.srvTTL},
					Priority: tg.Priority, Weight: tg.Weight, Port: tg.Port, Target: dns.Fqdn(tg.Name),
				})
				if s.glue {
					m.Extra = append(m.Extra, s.addrRRs(tg, dns.TypeA)...)
					m.Extra = append(m.Extra, s.addrRRs(tg, dns.TypeAAAA)...)
				}
			}
		}
	case dns.TypeA, dns.TypeAAAA:
		for _, targets := range s.srv {
			for _, tg := range targets {
				if strings.EqualFold(dns.Fqdn(tg.Name), name) {
					known = true
					m.Answer = append(m.Answer, s.addrRRs(tg, qq.Qtype)...)
				}
			}
		}
		if known {
			// dedupe if a target appears under several SRV names
			m.Answer = dedupe(m.Answer)
		}
	}
	if !known {
		m.Rcode = dns.RcodeNameError
	}
	if w.LocalAddr().Network() == "udp" {
		size := dns.MinMsgSize
		if opt := q.IsEdns0(); opt != nil {
			size = int(opt.UDPSize())
		}
		m.Truncate(size) // sets TC when it does not fit, like a real server
	}
	w.WriteMsg(m)
}

func (s *Server) addrRRs(tg Target, qtype uint16) []dns.RR {
	var out []dns.RR
	for _, a := range tg.Addrs {
		hdr := dns.RR_Header{Name: dns.Fqdn(tg.Name), Class: dns.ClassINET, Ttl: s.addrTTL}
		if a.Is4() && qtype == dns.TypeA {
			hdr.Rrtype = dns.TypeA
			out = append(out, &dns.A{Hdr: hdr, A: a.AsSlice()})
		} else if a.Is6() && !a.Is4In6() && qtype == dns.TypeAAAA {
			hdr.Rrtype = dns.TypeAAAA
			out = append(out, &dns.AAAA{Hdr: hdr, AAAA: a.AsSlice()})
		}
	}
	return out
}

func dedupe(rrs []dns.RR) []dns.RR {
	seen := make(map[string]bool)
	out := rrs[:0]
	for _, rr := range rrs {
		k := rr.String()
		if !seen[k] {
			seen[k] = true
			out = append(out, rr)
		}
	}
	return out
}

// String describes the server for logs.
func (s *Server) String() string { return fmt.Sprintf("dnstest.Server(%s)", s.addr) }
