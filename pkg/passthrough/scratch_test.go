package passthrough

import (
	"crypto/tls"
	"io"
	"net"
	"testing"
	"time"

	"github.com/rl-tproxy/rl-tproxy/pkg/exchange"
	"github.com/rl-tproxy/rl-tproxy/pkg/sniff"
)

// goHello returns the ClientHello a crypto/tls client sends for sni
// (one record).
func goHello(t *testing.T, sni string) []byte {
	t.Helper()
	c, s := net.Pipe()
	defer s.Close()
	go func() {
		tls.Client(c, &tls.Config{ServerName: sni, NextProtos: []string{"h2"}}).Handshake()
		c.Close()
	}()
	s.SetReadDeadline(time.Now().Add(20 * time.Second))
	var out []byte
	buf := make([]byte, 4096)
	for {
		n, err := s.Read(buf)
		out = append(out, buf[:n]...)
		var h sniff.Hello
		if perr := sniff.ParseHello(out, nil, &h); perr == nil {
			return out[:h.Len]
		} else if perr != sniff.ErrNeedMore || err != nil {
			t.Fatalf("capture hello: %v %v", perr, err)
		}
	}
}

// fragmentHello splits a one-record hello into records of size bytes.
func fragmentHello(in []byte, size int) []byte {
	msg := in[5:]
	var out []byte
	for len(msg) > 0 {
		n := min(size, len(msg))
		out = append(out, 0x16, 3, 1, byte(n>>8), byte(n))
		out = append(out, msg[:n]...)
		msg = msg[n:]
	}
	return out
}

// TestScratchHeldUntilObserved: a ClientHello spread over records is
// joined in a pooled scratch buffer that Event.SNI points into; the buffer
// must not be back in the pool (and reused by another connection) while
// Observe reads the event. Observe here takes buffers from the pool and
// wipes them, as a concurrent connection would.
func TestScratchHeldUntilObserved(t *testing.T) {
	up, got := rawUpstream(t)
	ev := newEvents()
	relay := &Relay{Observe: func(e *Event) {
		var taken []*[sniff.MaxHello + 4]byte
		for range 8 {
			b := scratchPool.Get().(*[sniff.MaxHello + 4]byte)
			clear(b[:])
			taken = append(taken, b)
		}
		for _, b := range taken {
			scratchPool.Put(b)
		}
		ev.observe(e)
	}}
	addr := serveRelay(t, &sniHook{}, &exchange.Service{Name: "svc", Upstream: up, TLS: exchange.ModePassthrough}, relay)
	in := fragmentHello(goHello(t, "a.example"), 64)
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(20 * time.Second))
	c.Write(in)
	c.(*net.TCPConn).CloseWrite()
	if resp, err := io.ReadAll(c); string(resp) != "hello\n" {
		t.Fatalf("client got %q %v", resp, err)
	}
	if b := <-got; string(b) != string(in) {
		t.Fatalf("upstream got %d bytes, want the %d sent", len(b), len(in))
	}
	if e := ev.wait(t); e.Action != Relayed || !e.Admitted || string(e.SNI) != "a.example" {
		t.Fatalf("event: action %v admitted %v SNI %q", e.Action, e.Admitted, e.SNI)
	}
}
