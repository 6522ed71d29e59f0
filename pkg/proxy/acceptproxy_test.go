package proxy

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rl-tproxy/rl-tproxy/pkg/exchange"
	"github.com/rl-tproxy/rl-tproxy/pkg/proxyproto"
	"github.com/rl-tproxy/rl-tproxy/pkg/realip"
)

// Service.AcceptProxy: a trusted peer's PROXY header (v1 or v2, whole or
// a byte at a time) names the request's client and the peer becomes
// Request.Peer; a trusted peer without one, or with a malformed one, and
// an untrusted peer that sends one are refused (closed, counted) and
// never reach the Hook; an untrusted peer's plain request is served with
// its own address.
func TestAcceptProxy(t *testing.T) {
	client := netip.MustParseAddrPort("192.0.2.44:5555")
	v1 := "PROXY TCP4 192.0.2.44 10.0.0.1 5555 80\r\n"
	v2 := string(proxyproto.Append(nil, proxyproto.V2, client, netip.MustParseAddrPort("10.0.0.1:80")))
	const get = "GET /x HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n"
	for _, tc := range []struct {
		name     string
		trusted  string // the trusted set (the test's client is 127.0.0.1)
		send     string
		dribble  bool   // one byte per write
		remote   string // "" = refused
		rejected string // the rule counted
	}{
		{"v1 from trusted", "127.0.0.1", v1 + get, false, "192.0.2.44:5555", ""},
		{"v2 from trusted", "127.0.0.0/8", v2 + get, false, "192.0.2.44:5555", ""},
		{"v1 a byte at a time", "127.0.0.1", v1 + get, true, "192.0.2.44:5555", ""},
		{"local from trusted (health check)", "127.0.0.1", "PROXY UNKNOWN\r\n" + get, false, "peer", ""},
		{"trusted without header", "127.0.0.1", get, false, "", "proxy-header-missing"},
		{"trusted with bad header", "127.0.0.1", "PROXY TCP4 192.0.2.44 10.0.0.1 01 80\r\n" + get, false, "", "proxy-header-invalid"},
		{"untrusted with header", "10.0.0.0/8", v1 + get, false, "", "proxy-header-untrusted"},
		{"untrusted plain request", "10.0.0.0/8", get, false, "peer", ""},
		{"untrusted POST (starts like PROXY)", "10.0.0.0/8", "POST /x HTTP/1.1\r\nHost: h\r\nContent-Length: 0\r\nConnection: close\r\n\r\n", false, "peer", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tr, err := realip.ParseTrusted([]string{tc.trusted})
			if err != nil {
				t.Fatal(err)
			}
			var mu sync.Mutex
			var seen []exchange.Request
			var rejects []string
			hook := newTestHook(func(_ context.Context, r *exchange.Request) exchange.Decision {
				mu.Lock()
				seen = append(seen, exchange.Request{Remote: r.Remote, Peer: r.Peer})
				mu.Unlock()
				return exchange.Decision{Allow: true}
			})
			up := httpUpstream(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") }))
			_, addr := startProxy(t, hook, &exchange.Service{Upstream: up, AcceptProxy: tr}, func(c *Config) {
				c.OnReject = func(_ *exchange.Service, _ netip.AddrPort, rule string, _ int) {
					mu.Lock()
					rejects = append(rejects, rule)
					mu.Unlock()
				}
			})
			c, err := net.Dial("tcp", addr)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			c.SetDeadline(time.Now().Add(30 * time.Second))
			if tc.dribble {
				for i := 0; i < len(tc.send); i++ {
					if _, err := c.Write([]byte{tc.send[i]}); err != nil {
						t.Fatal(err)
					}
				}
			} else if _, err := io.WriteString(c, tc.send); err != nil {
				t.Fatal(err)
			}
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			if tc.remote == "" {
				if err == nil {
					t.Fatalf("refused connection answered %s", resp.Status)
				}
				mu.Lock()
				defer mu.Unlock()
				if len(seen) != 0 || len(rejects) != 1 || rejects[0] != tc.rejected {
					t.Fatalf("hook saw %d requests, rejections %q; want none and [%s]", len(seen), rejects, tc.rejected)
				}
				return
			}
			if err != nil {
				t.Fatalf("no answer: %v", err)
			}
			resp.Body.Close()
			mu.Lock()
			defer mu.Unlock()
			if len(seen) != 1 || len(rejects) != 0 {
				t.Fatalf("hook saw %d requests, rejections %q", len(seen), rejects)
			}
			peer := c.LocalAddr().(*net.TCPAddr).AddrPort()
			got := seen[0]
			if tc.remote == "peer" {
				if got.Remote != netip.AddrPortFrom(peer.Addr().Unmap(), peer.Port()) || got.Peer.IsValid() {
					t.Fatalf("Remote %v Peer %v, want the peer %v and no Peer", got.Remote, got.Peer, peer)
				}
				return
			}
			if got.Remote.String() != tc.remote || got.Peer.Port() != peer.Port() {
				t.Fatalf("Remote %v Peer %v, want %s and the peer %v", got.Remote, got.Peer, tc.remote, peer)
			}
		})
	}
}

// A PROXY header that never ends is cut at the header timeout, like a
// slow request head, and counted.
func TestAcceptProxySlowHeader(t *testing.T) {
	tr, _ := realip.ParseTrusted([]string{"127.0.0.1"})
	var mu sync.Mutex
	var rejects []string
	_, addr := startProxy(t, newTestHook(nil), &exchange.Service{Upstream: "127.0.0.1:1", AcceptProxy: tr, HeaderTimeout: 200 * time.Millisecond}, func(c *Config) {
		c.OnReject = func(_ *exchange.Service, _ netip.AddrPort, rule string, _ int) {
			mu.Lock()
			rejects = append(rejects, rule)
			mu.Unlock()
		}
	})
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	io.WriteString(c, "PROXY TCP4 192.0.2.44 ")
	c.SetReadDeadline(time.Now().Add(30 * time.Second))
	b, err := io.ReadAll(c)
	if err != nil {
		t.Fatalf("connection not closed at the header timeout: %v", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(rejects) != 1 || !strings.Contains(rejects[0], "timeout") {
		t.Fatalf("answer %q, rejections %q; want the connection closed and one timeout counted", b, rejects)
	}
}
