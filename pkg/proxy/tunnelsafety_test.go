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
)

// rejectLog records OnReject calls.
type rejectLog struct {
	mu    sync.Mutex
	rules []string
}

func (l *rejectLog) add(_ *Service, _ netip.AddrPort, rule string, status int) {
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
	_, addr := startProxy(t, nil, &Service{Upstream: up.addr()}, func(c *Config) {
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
