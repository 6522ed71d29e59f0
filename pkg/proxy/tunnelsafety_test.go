package proxy

import (
	"bufio"
	"io"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rl-tproxy/rl-tproxy/pkg/exchange"
)

// rejectLog records OnReject calls.
type rejectLog struct {
	mu    sync.Mutex
	rules []string
}

func (l *rejectLog) add(_ *exchange.Service, _ netip.AddrPort, rule string, status int) {
	l.mu.Lock()
	l.rules = append(l.rules, rule+" "+strconv.Itoa(status))
	l.mu.Unlock()
}

func (l *rejectLog) list() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.rules...)
}

// CONNECT is refused on the HTTP/1.1 path (501, as on HTTP/2) and never
// reaches the upstream: an upstream that honoured it would turn its
// connection into a tunnel, and a pooled tunnel would carry the next
// client's request to whatever CONNECT named.
func TestConnectRefused(t *testing.T) {
	var mu sync.Mutex
	var seen []string
	up := newRawUpstream(t, func(_ int, c net.Conn) {
		br := bufio.NewReader(c)
		for {
			head, err := readRequestHead(br)
			if err != nil {
				return
			}
			line, _, _ := strings.Cut(head, "\r\n")
			mu.Lock()
			seen = append(seen, line)
			mu.Unlock()
			if strings.HasPrefix(head, "CONNECT ") {
				io.WriteString(c, "HTTP/1.1 200 Connection Established\r\n\r\n")
				io.Copy(io.Discard, br) // a tunnel from here on
				return
			}
			io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
		}
	})
	var rej rejectLog
	_, addr := startProxy(t, nil, &exchange.Service{Upstream: up.addr()}, func(c *Config) {
		c.EventLoops = 1
		c.OnReject = rej.add
	})
	a := dialClient(t, addr)
	a.send("CONNECT target.example:443 HTTP/1.1\r\nHost: target.example:443\r\n\r\n")
	head, err := readRequestHead(a.br)
	if err != nil || !strings.HasPrefix(head, "HTTP/1.1 501 ") || !strings.Contains(head, "Connection: close\r\n") {
		t.Fatalf("CONNECT answered %q (%v), want 501 and close", head, err)
	}
	if _, err := io.ReadFull(a.br, make([]byte, len(statusBody(501)))); err != nil {
		t.Fatal(err)
	}
	a.expectClosed()

	b := dialClient(t, addr)
	b.send("GET /next HTTP/1.1\r\nHost: x\r\n\r\n")
	if res, body := b.resp("GET"); res.StatusCode != 200 || body != "ok" {
		t.Fatalf("next request: %d %q", res.StatusCode, body)
	}
	mu.Lock()
	got := strings.Join(seen, "|")
	mu.Unlock()
	if got != "GET /next HTTP/1.1" {
		t.Fatalf("upstream saw %q, want only the GET", got)
	}
	if r := rej.list(); len(r) != 1 || r[0] != "connect-unsupported 501" {
		t.Fatalf("rejections %q", r)
	}
}

// A 2xx to CONNECT and a 101 leave their connection a tunnel.
func TestTunnelAnswerNeverReusable(t *testing.T) {
	for _, tc := range []struct {
		method string
		status int
		want   bool
	}{
		{"CONNECT", 200, true}, {"connect", 204, true}, {"CONNECT", 407, false},
		{"GET", 101, true}, {"GET", 200, false}, {"CONNECT", 101, true},
	} {
		if got := tunnelAnswer([]byte(tc.method), tc.status); got != tc.want {
			t.Errorf("tunnelAnswer(%s, %d) = %v, want %v", tc.method, tc.status, got, tc.want)
		}
	}
}

// Once the upstream's response head reached the client, a request body
// that breaks a rule ends the exchange without an answer of the proxy's
// own inside the relayed body: the upstream is dropped, the client's
// response ends short, and Done keeps the relayed status with the cause.
func TestRequestFailAfterResponseHead(t *testing.T) {
	for _, tc := range []struct {
		name, more string
		maxBody    int64
	}{
		{"malformed-chunk", "zz\r\n", 0},
		{"body-too-large", "20\r\n" + strings.Repeat("b", 32) + "\r\n", 16},
	} {
		t.Run(tc.name, func(t *testing.T) {
			upGone := make(chan struct{})
			up := newRawUpstream(t, func(_ int, c net.Conn) {
				defer close(upGone)
				br := bufio.NewReader(c)
				if _, err := readRequestHead(br); err != nil {
					return
				}
				io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n"+strings.Repeat("a", 10))
				io.Copy(io.Discard, br) // until the proxy drops the connection
			})
			hook := newTestHook(nil)
			var rej rejectLog
			_, addr := startProxy(t, hook, &exchange.Service{Upstream: up.addr(), MaxBodyBytes: tc.maxBody}, func(c *Config) {
				c.EventLoops = 1
				c.OnReject = rej.add
			})
			cl := dialClient(t, addr)
			cl.send("POST /stream HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n")
			head, err := readRequestHead(cl.br)
			if err != nil || !strings.HasPrefix(head, "HTTP/1.1 200 ") {
				t.Fatalf("response head %q %v", head, err)
			}
			if _, err := io.ReadFull(cl.br, make([]byte, 10)); err != nil {
				t.Fatal(err)
			}
			cl.send(tc.more)
			rest, err := io.ReadAll(cl.br) // bounded by the client's deadline
			if err != nil && !isReset(err) {
				t.Fatalf("after the broken body: %v (read %q)", err, rest)
			}
			if len(rest) != 0 {
				t.Fatalf("the client got %q after the relayed bytes, want the connection closed", rest)
			}
			select {
			case <-upGone:
			case <-time.After(10 * time.Second):
				t.Fatal("the upstream connection was not dropped")
			}
			d := hook.waitDone(t)
			if d.status != 200 || d.upstreamErr == nil || !strings.Contains(d.upstreamErr.Error(), "after the response head") {
				t.Fatalf("Done: status %d, err %v; want 200 and the cause", d.status, d.upstreamErr)
			}
			if r := rej.list(); len(r) != 1 || !strings.HasSuffix(r[0], " 0") {
				t.Fatalf("rejections %q, want one with status 0 (nothing answered)", r)
			}
		})
	}
}
