package proxy

import (
	"bufio"
	"context"
	"io"
	"net"
	"strings"
	"testing"

	"github.com/rl-tproxy/rl-tproxy/pkg/exchange"
)

// TestH2CUpgradeRefused: an HTTP/1.1 request with Upgrade: h2c is forwarded
// as a plain request (no Upgrade, no HTTP2-Settings, named in Connection or
// not, with Connection: upgrade or without it, or with no Upgrade at all),
// so an upstream that
// would switch to HTTP/2 answers in HTTP/1.1 and every later request is
// admitted on its own; a WebSocket upgrade still goes through as one.
func TestH2CUpgradeRefused(t *testing.T) {
	heads := make(chan string, 4)
	up := newRawUpstream(t, func(_ int, c net.Conn) {
		br := bufio.NewReader(c)
		for {
			head, err := readRequestHead(br)
			if err != nil {
				return
			}
			heads <- head
			if headerOf(head, "Upgrade") != "" { // what an h2c-capable server would do
				io.WriteString(c, "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: h2c\r\n\r\n")
				return
			}
			io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
		}
	})
	hook := newTestHook(func(context.Context, *exchange.Request) exchange.Decision { return exchange.Decision{Allow: true} })
	_, addr := startProxy(t, hook, &exchange.Service{Upstream: up.addr()}, nil)
	c := dialClient(t, addr)
	// The second request does not name HTTP2-Settings in Connection, the
	// third does not list "upgrade" (the parser then sees no upgrade at
	// all), the fourth has no Upgrade field: the field is dropped all
	// the same.
	reqs := []string{
		"Connection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\n",
		"Connection: Upgrade\r\nUpgrade: h2c\r\n",
		"Connection: keep-alive\r\nUpgrade: h2c\r\n",
		"",
	}
	for i, fields := range reqs {
		c.send("GET /h2c HTTP/1.1\r\nHost: x\r\n" + fields + "HTTP2-Settings: AAMAAABkAAQCAAAAAAIAAAAA\r\nX-After: 1\r\n\r\n")
		r, body := c.resp("GET")
		if r.StatusCode != 200 || body != "ok" {
			t.Fatalf("request %d: %d %q, want the upstream's plain 200", i, r.StatusCode, body)
		}
		head := <-heads
		for _, gone := range []string{"Upgrade", "HTTP2-Settings"} {
			if v := headerOf(head, gone); v != "" {
				t.Errorf("request %d: %s forwarded: %q", i, gone, v)
			}
		}
		if headerOf(head, "X-After") != "1" {
			t.Errorf("request %d: the field after HTTP2-Settings is lost: %q", i, head)
		}
		if strings.Contains(strings.ToLower(headerOf(head, "Connection")), "upgrade") {
			t.Errorf("request %d: Connection: upgrade forwarded", i)
		}
	}
	if got := hook.admitted(); len(got) != len(reqs) {
		t.Fatalf("admitted %v, want each request admitted", got)
	}
}
