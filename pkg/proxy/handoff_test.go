package proxy

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/rl-tproxy/rl-tproxy/pkg/exchange"
	"github.com/rl-tproxy/rl-tproxy/pkg/sniff"
)

// echoHandoff takes the kinds in takes; ServeConn writes back the kind and
// the buffered bytes, then echoes the connection until EOF or drain.
type echoHandoff struct {
	takes map[sniff.Kind]bool
	mu    sync.Mutex
	seen  []exchange.HandoffConn
}

func (e *echoHandoff) Takes(k sniff.Kind, _ *exchange.Service) bool { return e.takes[k] }

func (e *echoHandoff) ServeConn(hc *exchange.HandoffConn) {
	e.mu.Lock()
	e.seen = append(e.seen, *hc)
	e.mu.Unlock()
	hc.Conn.SetReadDeadline(time.Time{})
	io.WriteString(hc.Conn, hc.Kind.String()+":"+string(hc.Buffered)+"|")
	done := make(chan struct{})
	go func() {
		defer close(done)
		io.Copy(hc.Conn, hc.Conn)
	}()
	select {
	case <-done:
	case <-hc.Drain:
		io.WriteString(hc.Conn, "drain")
		hc.Conn.Close()
		<-done
	}
}

func TestDispatch(t *testing.T) {
	up := httpUpstream(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "http1") }))
	h := &echoHandoff{takes: map[sniff.Kind]bool{sniff.TLS: true, sniff.Other: true, sniff.HTTP2: true}}
	svc := &exchange.Service{Upstream: up, HeaderTimeout: 5 * time.Second}
	_, addr := startProxy(t, nil, svc, func(c *Config) { c.Handoff = h })

	// HTTP/1.1 keeps today's path.
	c := dialClient(t, addr)
	c.send("GET / HTTP/1.1\r\nHost: a\r\n\r\n")
	if r, body := c.resp("GET"); r.StatusCode != 200 || body != "http1" {
		t.Fatalf("http1: %d %q", r.StatusCode, body)
	}
	// Split first bytes: the kind is decided once enough arrived, and every
	// byte read so far is handed over.
	for _, tt := range []struct{ parts []string }{
		{[]string{"\x16\x03", "\x01\x00\x20\x01rest"}},
		{[]string{"SSH-2.0-OpenSSH_9.2p1 ", "Debian\r\n"}},
		{[]string{"PRI * HTTP/2.0\r\n", "\r\nSM\r\n\r\n"}},
		{[]string{"\x00\x01binary"}},
	} {
		c := dialClient(t, addr)
		for _, p := range tt.parts {
			c.send(p)
		}
		all := ""
		for _, p := range tt.parts {
			all += p
		}
		want := sniff.Detect([]byte(all)).String() + ":" + all + "|"
		got := make([]byte, len(want))
		if _, err := io.ReadFull(c.br, got); err != nil || string(got) != want {
			t.Fatalf("parts %q: got %q (%v), want %q", tt.parts, got, err, want)
		}
		c.send("more")
		got = got[:4]
		if _, err := io.ReadFull(c.br, got); err != nil || string(got) != "more" {
			t.Fatalf("echo: %q %v", got, err)
		}
	}
}

// TestDispatchNotTaken: kinds the Handoff does not take stay on the
// HTTP/1.x path (today's answers).
func TestDispatchNotTaken(t *testing.T) {
	up := newRawUpstream(t, func(int, net.Conn) {})
	h := &echoHandoff{takes: map[sniff.Kind]bool{}}
	_, addr := startProxy(t, nil, &exchange.Service{Upstream: up.addr()}, func(c *Config) { c.Handoff = h })
	c := dialClient(t, addr)
	c.send("\x16\x03\x01\x00\x20\x01\r\n\r\n")
	if r, _ := c.resp("GET"); r.StatusCode != 400 {
		t.Fatalf("status %d", r.StatusCode)
	}
	if len(h.seen) != 0 || up.count() != 0 {
		t.Fatalf("handed off %d, upstream %d", len(h.seen), up.count())
	}
}

// rejectRecorder records "rule:status" for every rejection reported to
// it, as Config.OnReject or as a Hook's Rejecter.
type rejectRecorder struct {
	allowHook
	mu    sync.Mutex
	rules []string
}

func (r *rejectRecorder) Reject(_ *exchange.Service, _ netip.AddrPort, rule string, status int) {
	r.mu.Lock()
	r.rules = append(r.rules, rule+":"+strconv.Itoa(status))
	r.mu.Unlock()
}

func (r *rejectRecorder) seen() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.rules...)
}

// TestDispatchSlow: first bytes that never decide a kind end the
// connection at the header timeout: a would-be HTTP request with 408,
// anything else closed and reported as detect-timeout, both to
// Config.OnReject and to a Hook's Rejecter (which feeds the rejection
// metric in the real binary, where OnReject is unset).
func TestDispatchSlow(t *testing.T) {
	for _, viaHook := range []bool{false, true} {
		t.Run(map[bool]string{false: "OnReject", true: "Rejecter"}[viaHook], func(t *testing.T) {
			up := newRawUpstream(t, func(int, net.Conn) {})
			h := &echoHandoff{takes: map[sniff.Kind]bool{sniff.TLS: true, sniff.Other: true}}
			rec := &rejectRecorder{}
			var hook exchange.Hook
			if viaHook {
				hook = rec
			}
			_, addr := startProxy(t, hook, &exchange.Service{Upstream: up.addr(), HeaderTimeout: 300 * time.Millisecond}, func(c *Config) {
				c.Handoff = h
				if !viaHook {
					c.OnReject = rec.Reject
				}
			})
			c := dialClient(t, addr)
			c.send("\x16\x03\x01")
			c.expectClosed()
			c = dialClient(t, addr)
			c.send("GE")
			if r, _ := c.resp("GET"); r.StatusCode != 408 {
				t.Fatalf("status %d", r.StatusCode)
			}
			c = dialClient(t, addr)
			c.send("GET")
			c.send(" / HTTP/1.1\r\n")
			if r, _ := c.resp("GET"); r.StatusCode != 408 {
				t.Fatalf("status %d", r.StatusCode)
			}
			rules := rec.seen()
			if len(rules) != 3 || rules[0] != "detect-timeout:0" || rules[1] != "header-timeout:408" || rules[2] != rules[1] {
				t.Fatalf("rejects %q", rules)
			}
			if len(h.seen) != 0 || up.count() != 0 {
				t.Fatalf("handed off %d, upstream %d", len(h.seen), up.count())
			}
		})
	}
}

// TestDispatchDrain: Shutdown tells a handed-off connection to finish.
func TestDispatchDrain(t *testing.T) {
	h := &echoHandoff{takes: map[sniff.Kind]bool{sniff.Other: true}}
	p, addr := startProxy(t, nil, &exchange.Service{Upstream: "127.0.0.1:1"}, func(c *Config) { c.Handoff = h })
	c := dialClient(t, addr)
	c.send("\x00")
	got := make([]byte, len("other:\x00|"))
	if _, err := io.ReadFull(c.br, got); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := p.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	rest, _ := io.ReadAll(c.br)
	if string(rest) != "drain" {
		t.Fatalf("after drain: %q", rest)
	}
}
