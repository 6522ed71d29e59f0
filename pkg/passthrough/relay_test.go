package passthrough

import (
	"bufio"
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"io"
	"math/big"
	"net"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rl-tproxy/rl-tproxy/pkg/exchange"
	"github.com/rl-tproxy/rl-tproxy/pkg/proxy"
	"github.com/rl-tproxy/rl-tproxy/pkg/proxyproto"
	"github.com/rl-tproxy/rl-tproxy/pkg/sniff"
)

// sniHook admits unless the SNI is in deny; it records what it saw.
type sniHook struct {
	mu    sync.Mutex
	deny  map[string]bool
	seen  []string
	dones []exchange.Result
}

func (h *sniHook) Admit(_ context.Context, r *exchange.Request) exchange.Decision {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.seen = append(h.seen, r.Proto+" "+string(r.SNI)+" "+string(r.ALPN))
	return exchange.Decision{Allow: !h.deny[string(r.SNI)]}
}

func (h *sniHook) Done(_ *exchange.Request, _ *exchange.Decision, res *exchange.Result) {
	h.mu.Lock()
	h.dones = append(h.dones, *res)
	h.mu.Unlock()
}

// events collects Observe calls.
type events struct {
	mu  sync.Mutex
	evs []Event
	ch  chan struct{}
}

func newEvents() *events { return &events{ch: make(chan struct{}, 100)} }

func (e *events) observe(ev *Event) {
	e.mu.Lock()
	cp := *ev
	cp.SNI = bytes.Clone(ev.SNI)
	e.evs = append(e.evs, cp)
	e.mu.Unlock()
	e.ch <- struct{}{}
}

// wait returns the next event (bounded).
func (e *events) wait(t *testing.T) Event {
	t.Helper()
	select {
	case <-e.ch:
	case <-time.After(20 * time.Second):
		t.Fatal("no connection event")
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.evs[len(e.evs)-1]
}

func start(t *testing.T, hook exchange.Hook, svc *exchange.Service) (string, *events) {
	t.Helper()
	ev := newEvents()
	return serveRelay(t, hook, svc, &Relay{Observe: ev.observe}), ev
}

// serveRelay runs a proxy for svc on a loopback port with relay as its
// TLS and opaque Handoff and returns its address.
func serveRelay(t *testing.T, hook exchange.Hook, svc *exchange.Service, relay *Relay) string {
	t.Helper()
	cfg := proxy.Config{Config: exchange.Config{Services: []*exchange.Service{svc}}, Handoff: &exchange.HandoffMux{TLS: relay, Other: relay}}
	if hook != nil {
		cfg.Hook = hook
	}
	if svc.Name == "" {
		svc.Name = "svc"
	}
	p, err := proxy.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := proxy.Listen(context.Background(), "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go p.Serve(ln, svc)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		p.Shutdown(ctx)
		closeSplicePipes()
	})
	return ln.Addr().String()
}

// closeSplicePipes runs the two GC cycles after which the runtime closes
// the splice pipes it pools in a sync.Pool (from a finalizer): TestMain's
// descriptor check would find them open otherwise.
func closeSplicePipes() {
	runtime.GC()
	runtime.GC()
}

func selfSigned(t *testing.T, names ...string) tls.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: names[0]}, DNSNames: names,
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

// tlsUpstream serves TLS with an echo of "sni:<name>" per connection. With
// pp it first reads a PROXY header and answers it too.
func tlsUpstream(t *testing.T, pp bool) (string, *x509.CertPool) {
	t.Helper()
	cert := selfSigned(t, "a.example", "b.example")
	pool := x509.NewCertPool()
	leaf, _ := x509.ParseCertificate(cert.Certificate[0])
	pool.AddCert(leaf)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				br := bufio.NewReader(c)
				hdr := ""
				if pp {
					line, err := br.ReadString('\n')
					if err != nil {
						return
					}
					hdr = strings.TrimSpace(line)
				}
				tc := tls.Server(&bufConn{Conn: c, r: br}, &tls.Config{Certificates: []tls.Certificate{cert}, NextProtos: []string{"h2", "http/1.1"}})
				if err := tc.Handshake(); err != nil {
					return
				}
				io.WriteString(tc, "sni:"+tc.ConnectionState().ServerName+" alpn:"+tc.ConnectionState().NegotiatedProtocol+" pp:"+hdr+"\n")
				io.Copy(tc, tc)
			}()
		}
	}()
	return ln.Addr().String(), pool
}

type bufConn struct {
	net.Conn
	r *bufio.Reader
}

func (b *bufConn) Read(p []byte) (int, error) { return b.r.Read(p) }

func TestTLSPassthrough(t *testing.T) {
	up, pool := tlsUpstream(t, true)
	hook := &sniHook{deny: map[string]bool{"b.example": true}}
	addr, ev := start(t, hook, &exchange.Service{Upstream: up, TLS: exchange.ModePassthrough, ProxyProtocol: proxyproto.V1})

	c, err := tls.Dial("tcp", addr, &tls.Config{ServerName: "a.example", RootCAs: pool, NextProtos: []string{"h2"}})
	if err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		t.Fatal(err)
	}
	local := c.LocalAddr().(*net.TCPAddr)
	want := "sni:a.example alpn:h2 pp:PROXY TCP4 127.0.0.1 " + strings.Split(addr, ":")[0] + " " +
		itoa(local.Port) + " " + strings.Split(addr, ":")[1] + "\n"
	if line != want {
		t.Fatalf("got %q\nwant %q", line, want)
	}
	io.WriteString(c, "ping")
	buf := make([]byte, 4)
	if _, err := io.ReadFull(c, buf); err != nil || string(buf) != "ping" {
		t.Fatalf("echo %q %v", buf, err)
	}
	c.Close()
	e := ev.wait(t)
	if e.Action != Relayed || !e.Admitted || string(e.SNI) != "a.example" || e.BytesIn == 0 || e.BytesOut == 0 {
		t.Fatalf("event %+v", e)
	}

	// A denied SNI: the handshake fails (reset), the upstream never sees it.
	if _, err := tls.Dial("tcp", addr, &tls.Config{ServerName: "b.example", RootCAs: pool}); err == nil {
		t.Fatal("denied SNI completed a handshake")
	}
	if e := ev.wait(t); e.Action != Denied || string(e.SNI) != "b.example" {
		t.Fatalf("event %+v", e)
	}
	hook.mu.Lock()
	defer hook.mu.Unlock()
	if len(hook.seen) != 2 || hook.seen[0] != "tls-passthrough a.example h2" || len(hook.dones) != 2 {
		t.Fatalf("hook saw %q, %d dones", hook.seen, len(hook.dones))
	}
	if d := hook.dones[0]; d.BytesIn == 0 || d.BytesOut == 0 || d.End.IsZero() || d.Upstream != up {
		t.Fatalf("done %+v", d)
	}
}

func itoa(n int) string { return strconv.Itoa(n) }

// rawUpstream records every connection's bytes until EOF and answers
// "hello\n" first.
func rawUpstream(t *testing.T) (string, chan []byte) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	got := make(chan []byte, 10)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				io.WriteString(c, "hello\n")
				b, _ := io.ReadAll(c)
				got <- b
			}()
		}
	}()
	return ln.Addr().String(), got
}

// TestOpaque: other protocols reach the service byte for byte
// (passthrough, the default) or are closed and counted (reject).
func TestOpaque(t *testing.T) {
	up, got := rawUpstream(t)
	random := make([]byte, 4096)
	rand.Read(random)
	random[0] = 0 // never a token byte
	for _, in := range [][]byte{[]byte("SSH-2.0-OpenSSH_9.2p1 Debian-2+deb12u3\r\nrest of the protocol"), random} {
		addr, ev := start(t, nil, &exchange.Service{Upstream: up})
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		c.Write(in)
		c.(*net.TCPConn).CloseWrite()
		resp, _ := io.ReadAll(c)
		c.Close()
		if string(resp) != "hello\n" {
			t.Fatalf("client got %q", resp)
		}
		if b := <-got; !bytes.Equal(b, in) {
			t.Fatalf("upstream got %q", b[:min(len(b), 64)])
		}
		if e := ev.wait(t); e.Action != Relayed || e.Kind != sniff.Other || e.BytesIn != int64(len(in)) || e.BytesOut != 6 {
			t.Fatalf("event %+v", e)
		}
	}
	addr, ev := start(t, nil, &exchange.Service{Upstream: up, Opaque: exchange.ModeReject, TLS: exchange.ModeDefault})
	for _, in := range []string{"SSH-2.0-OpenSSH_9.2p1\r\n", "\x16\x03\x01\x00\x05\x01\x00\x00\x01\x00"} {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		io.WriteString(c, in)
		c.SetReadDeadline(time.Now().Add(20 * time.Second))
		if b, err := io.ReadAll(c); len(b) != 0 || err != nil && !strings.Contains(err.Error(), "reset") {
			t.Fatalf("rejected connection got %q %v", b, err)
		}
		c.Close()
		if e := ev.wait(t); e.Action != Rejected {
			t.Fatalf("event %+v", e)
		}
	}
	select {
	case b := <-got:
		t.Fatalf("a rejected connection reached the upstream: %q", b)
	default:
	}
}

// TestHelloAbuse: malformed, oversized and slow ClientHellos are reset or
// closed by the header timeout; nothing reaches the upstream or the hook.
func TestHelloAbuse(t *testing.T) {
	up, got := rawUpstream(t)
	hook := &sniHook{}
	addr, ev := start(t, hook, &exchange.Service{Upstream: up, TLS: exchange.ModePassthrough, HeaderTimeout: 500 * time.Millisecond})
	big := []byte{0x16, 3, 1, 0x40, 0x00, 1, 0, 0x3f, 0xfc} // a 16 KiB record holding a hello that claims 16380 bytes
	big = append(big, make([]byte, 0x4000-4)...)
	for _, tt := range []struct {
		name string
		in   []byte
		want Action
	}{
		{"bad sni", append(append([]byte{0x16, 3, 1, 0, 59, 1, 0, 0, 55, 3, 3}, make([]byte, 32)...),
			0, 0, 2, 0x13, 1, 1, 0, 0, 12, 0, 0, 0, 8, 0, 6, 0, 0, 3, 'a', ' ', 'b'), Malformed},
		{"huge length", []byte{0x16, 3, 1, 0, 4, 1, 0xff, 0xff, 0xff}, Malformed},
		{"oversized body", big, Malformed},
		{"slow", []byte{0x16, 3, 1, 0, 200, 1, 0, 0, 196, 3, 3}, Timeout},
	} {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		c.Write(tt.in)
		c.SetReadDeadline(time.Now().Add(20 * time.Second))
		b, _ := io.ReadAll(c)
		c.Close()
		if len(b) != 0 {
			t.Fatalf("%s: got %q", tt.name, b)
		}
		if e := ev.wait(t); e.Action != tt.want {
			t.Fatalf("%s: event %+v", tt.name, e)
		}
	}
	select {
	case b := <-got:
		t.Fatalf("reached the upstream: %q", b)
	default:
	}
	if len(hook.seen) != 0 {
		t.Fatalf("hook saw %q", hook.seen)
	}
}

// TestHalfOpenGrace: when the service has closed and the client keeps
// its side open (or vanished without a FIN), the relay ends after the
// idle timeout's grace instead of holding the connection forever; a
// client that resets mid-relay ends it at once.
func TestHalfOpenGrace(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			io.ReadFull(c, make([]byte, len("\x00opaque")))
			io.WriteString(c, "bye\n")
			c.Close() // the service is done; the client never closes
		}
	}()
	addr, ev := start(t, nil, &exchange.Service{Upstream: ln.Addr().String(), IdleTimeout: 200 * time.Millisecond})
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	io.WriteString(c, "\x00opaque")
	buf := make([]byte, 4)
	if _, err := io.ReadFull(c, buf); err != nil || string(buf) != "bye\n" {
		t.Fatalf("%q %v", buf, err)
	}
	// The client neither sends nor closes: the relay ends by the grace.
	if e := ev.wait(t); e.Action != Relayed || e.BytesOut != 4 {
		t.Fatalf("event %+v", e)
	}
	if _, err := c.Read(buf); err == nil {
		t.Fatal("client connection still open after the relay ended")
	}

	// A client that resets while the relay runs.
	up, got := rawUpstream(t)
	addr, ev = start(t, nil, &exchange.Service{Upstream: up})
	c2, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	io.WriteString(c2, "\x00x")
	io.ReadFull(c2, make([]byte, 6))
	c2.(*net.TCPConn).SetLinger(0)
	c2.Close()
	if e := ev.wait(t); e.Action != Relayed {
		t.Fatalf("event %+v", e)
	}
	<-got
}
