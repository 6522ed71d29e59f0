// Package embedded runs RateLimitly inside the process for `embedded: true`:
// a pkg/rlserver on loopback plus an in-process DNS server publishing its
// SRV record, so the client reaches it through the same discovery and wire
// code it uses in production.
//
// With Config.Loops the server runs on event loops rather than worker
// goroutines (pkg/rlserver's driven mode): LoopAttacher, given to the
// proxy (proxy.Proxy.Attach), serves server socket i on loop i, so an
// admission check a loop sends is read, decided and answered on a loop
// thread with the same wire, discovery and state. The proxy's node
// (internal/node) always runs it so.
package embedded

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"strings"
	"sync"

	"github.com/miekg/dns"

	"github.com/rl-tproxy/rl-tproxy/pkg/ratelimitly/credentials"
	"github.com/rl-tproxy/rl-tproxy/pkg/rlserver"
)

// Names the embedded DNS server answers.
const (
	SRVName    = "_ratelimitly._udp.embedded.rl-tproxy.internal."
	TargetName = "ratelimitly.embedded.rl-tproxy.internal."
	// TTL of the answers: short, the records never change while running.
	TTL = 30
)

// Config configures an embedded RateLimitly.
type Config struct {
	Credentials []credentials.Credential
	Workers     int // server sockets; 0 = 1 (a node-local toy server)
	// Loops > 0 runs the server on that many event loops instead of worker
	// goroutines: one socket per loop (Workers is ignored), served by the
	// loop that LoopAttacher attaches it to. Its datagrams wait in the
	// kernel until then.
	Loops  int
	Logger *slog.Logger // nil = discard
	// Hooks are the server's test hooks (nil in production).
	Hooks *rlserver.TestHooks
}

// Embedded is a running server and its DNS.
type Embedded struct {
	Server *rlserver.Server
	// SRV is the name to discover and Resolver the DNS address to ask.
	SRV      string
	Resolver string

	udp, tcp *dns.Server
	att      *LoopAttacher // Loops > 0
	log      *slog.Logger
	once     sync.Once
	err      error
}

// Start starts the server on 127.0.0.1:0 and the DNS server on another
// loopback port.
func Start(cfg Config) (*Embedded, error) {
	w := cfg.Workers
	if w == 0 {
		w = 1
	}
	if cfg.Loops > 0 {
		w = cfg.Loops
	}
	srv, err := rlserver.Start(rlserver.Config{Listen: "127.0.0.1:0", Credentials: cfg.Credentials, Workers: w,
		Driven: cfg.Loops > 0, Logger: cfg.Logger, Hooks: cfg.Hooks})
	if err != nil {
		return nil, fmt.Errorf("embedded ratelimitly: %w", err)
	}
	e := &Embedded{Server: srv, SRV: SRVName, log: cfg.Logger}
	if e.log == nil {
		e.log = slog.New(slog.DiscardHandler)
	}
	if cfg.Loops > 0 {
		e.att = &LoopAttacher{e: e}
	}
	if err := e.startDNS(srv.Addr()); err != nil {
		_ = srv.Close()
		return nil, fmt.Errorf("embedded ratelimitly dns: %w", err)
	}
	return e, nil
}

func (e *Embedded) startDNS(target netip.AddrPort) error {
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	h := dns.HandlerFunc(func(w dns.ResponseWriter, q *dns.Msg) { answer(w, q, target) })
	e.Resolver = pc.LocalAddr().String()
	e.udp = &dns.Server{PacketConn: pc, Handler: h}
	started := make(chan struct{})
	e.udp.NotifyStartedFunc = func() { close(started) }
	udpErr := make(chan error, 1)
	go func() { udpErr <- e.udp.ActivateAndServe() }()
	// TCP on the same port for clients that retry truncated answers; the
	// answers fit UDP, so failing to bind it is not fatal.
	// Both are waited for: Shutdown of a dns.Server that has not started
	// yet fails ("server not started"), so a Close right after Start did.
	if ln, err := net.Listen("tcp", e.Resolver); err == nil {
		tcp := &dns.Server{Listener: ln, Handler: h}
		tcpStarted, tcpErr := make(chan struct{}), make(chan error, 1)
		tcp.NotifyStartedFunc = func() { close(tcpStarted) }
		go func() { tcpErr <- tcp.ActivateAndServe() }()
		select {
		case <-tcpStarted:
			e.tcp = tcp
		case <-tcpErr: // not fatal (above)
		}
	}
	select {
	case <-started:
		return nil
	case err := <-udpErr:
		if e.tcp != nil {
			_ = e.tcp.Shutdown()
		}
		return err
	}
}

// answer serves SRV for SRVName and A for TargetName.
func answer(w dns.ResponseWriter, q *dns.Msg, target netip.AddrPort) {
	m := new(dns.Msg)
	m.SetReply(q)
	m.Authoritative = true
	if len(q.Question) != 1 {
		m.Rcode = dns.RcodeFormatError
		_ = w.WriteMsg(m)
		return
	}
	qq := q.Question[0]
	name := strings.ToLower(qq.Name)
	a := &dns.A{Hdr: dns.RR_Header{Name: TargetName, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: TTL}, A: net.IP(target.Addr().AsSlice())}
	switch {
	case name == SRVName && qq.Qtype == dns.TypeSRV:
		m.Answer = append(m.Answer, &dns.SRV{Hdr: dns.RR_Header{Name: SRVName, Rrtype: dns.TypeSRV, Class: dns.ClassINET, Ttl: TTL},
			Priority: 0, Weight: 1, Port: target.Port(), Target: TargetName})
		m.Extra = append(m.Extra, a)
	case name == TargetName && qq.Qtype == dns.TypeA:
		m.Answer = append(m.Answer, a)
	case name == SRVName || name == TargetName:
		// NOERROR, no data (AAAA and other types).
	default:
		m.Rcode = dns.RcodeNameError
	}
	_ = w.WriteMsg(m)
}

// Close stops DNS and the server; a loop-driven server's sockets are
// detached from their loops first (Close waits for that, bounded: do not
// call it from a loop thread). Idempotent.
func (e *Embedded) Close() error {
	e.once.Do(func() {
		if e.att != nil {
			e.att.detachAll()
		}
		var errs []error
		if e.tcp != nil {
			errs = append(errs, e.tcp.Shutdown())
		}
		errs = append(errs, e.udp.Shutdown(), e.Server.Close())
		e.err = errors.Join(errs...)
	})
	return e.err
}
