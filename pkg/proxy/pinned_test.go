package proxy

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rl-tproxy/rl-tproxy/pkg/exchange"
	"github.com/rl-tproxy/rl-tproxy/pkg/proxyproto"
)

// TestProxyProtocolHTTP1: each client connection gets its own upstream
// connection, which starts with a PROXY header naming that client, and
// keeps it for its later requests; no other client ever shares it.
func TestProxyProtocolHTTP1(t *testing.T) {
	var mu sync.Mutex
	headers := map[int]string{}
	up := newRawUpstream(t, func(n int, c net.Conn) {
		br := bufio.NewReader(c)
		line, err := readProxyHeader(br)
		if err != nil {
			return
		}
		mu.Lock()
		headers[n] = line
		mu.Unlock()
		for {
			if _, err := readRequestHead(br); err != nil {
				return
			}
			body := fmt.Sprintf("conn%d", n)
			fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
		}
	})
	_, addr := startProxy(t, nil, &exchange.Service{Upstream: up.addr(), ProxyProtocol: proxyproto.V1}, nil)
	clients := []*client{dialClient(t, addr), dialClient(t, addr)}
	for round := 0; round < 3; round++ {
		for i, c := range clients {
			c.send("GET / HTTP/1.1\r\nHost: a\r\n\r\n")
			r, body := c.resp("GET")
			if want := fmt.Sprintf("conn%d", i+1); r.StatusCode != 200 || round > 0 && body != want {
				t.Fatalf("round %d client %d: %d %q", round, i, r.StatusCode, body)
			}
		}
	}
	if up.count() != 2 {
		t.Fatalf("%d upstream connections, want 2", up.count())
	}
	mu.Lock()
	defer mu.Unlock()
	for n, c := range clients {
		local := c.c.LocalAddr().(*net.TCPAddr)
		want := fmt.Sprintf("PROXY TCP4 127.0.0.1 %s %d %d\r\n", strings.Split(addr, ":")[0], local.Port, c.c.RemoteAddr().(*net.TCPAddr).Port)
		if headers[n+1] != want {
			t.Errorf("upstream conn %d header %q, want %q", n+1, headers[n+1], want)
		}
	}
}

// TestProxyProtocolUpstreamGone: a pinned upstream connection the service
// closed is replaced by a fresh one with its own header.
func TestProxyProtocolUpstreamGone(t *testing.T) {
	up := newRawUpstream(t, func(n int, c net.Conn) {
		br := bufio.NewReader(c)
		if _, err := readProxyHeader(br); err != nil {
			return
		}
		if _, err := readRequestHead(br); err != nil {
			return
		}
		io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok") // then close
	})
	_, addr := startProxy(t, nil, &exchange.Service{Upstream: up.addr(), ProxyProtocol: proxyproto.V2}, nil)
	c := dialClient(t, addr)
	for i := 0; i < 3; i++ {
		c.send("GET / HTTP/1.1\r\nHost: a\r\n\r\n")
		if r, body := c.resp("GET"); r.StatusCode != 200 || body != "ok" {
			t.Fatalf("request %d: %d %q", i, r.StatusCode, body)
		}
	}
	if up.count() != 3 {
		t.Fatalf("%d upstream connections, want 3", up.count())
	}
}

// TestProxyProtocolStrayNeverReused: stray bytes after a response on a
// pinned upstream connection, whether they arrive with the response or
// while the connection waits for the client's next request, never reach
// that request (a POST, which is never retried): the connection is
// replaced by a fresh one with its own header.
func TestProxyProtocolStrayNeverReused(t *testing.T) {
	const stray = "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nSTRAY"
	for _, late := range []bool{false, true} {
		t.Run(fmt.Sprintf("late=%v", late), func(t *testing.T) {
			release, sent := make(chan struct{}), make(chan struct{}, 1)
			up := newRawUpstream(t, func(n int, c net.Conn) {
				br := bufio.NewReader(c)
				if _, err := readProxyHeader(br); err != nil {
					return
				}
				for k := 0; ; k++ {
					head, err := readRequestHead(br)
					if err != nil {
						return
					}
					if strings.HasPrefix(head, "POST") {
						br.Discard(3)
					}
					body := fmt.Sprintf("conn%d", n)
					r := fmt.Sprintf("HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
					if n == 1 && k == 0 && !late {
						r += stray
					}
					io.WriteString(c, r)
					if n == 1 && k == 0 && late {
						<-release
						io.WriteString(c, stray)
						sent <- struct{}{}
					}
				}
			})
			p, addr := startProxy(t, nil, &exchange.Service{Upstream: up.addr(), ProxyProtocol: proxyproto.V1}, nil)
			c := dialClient(t, addr)
			c.send("GET / HTTP/1.1\r\nHost: a\r\n\r\n")
			if r, body := c.resp("GET"); r.StatusCode != 200 || body != "conn1" {
				t.Fatalf("first: %d %q", r.StatusCode, body)
			}
			close(release)
			if late {
				<-sent // queued at the proxy's idle pinned socket
			}
			c.send("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\n\r\nabc")
			if r, body := c.resp("POST"); r.StatusCode != 200 || body != "conn2" {
				t.Fatalf("second: %d %q, want conn2", r.StatusCode, body)
			}
			if up.count() != 2 || p.Stats().UpstreamDiscarded != 1 {
				t.Fatalf("upstream connections %d, stats %+v; want 2 and 1 discarded", up.count(), p.Stats())
			}
		})
	}
}

// headerUpstream is a raw upstream that records the PROXY header each of
// its connections started with ("" for none), answers every request with
// name and the connection's number, and reports each connection's end.
type headerUpstream struct {
	*rawUpstream
	mu      sync.Mutex
	headers map[int]string
	ended   chan int
}

func newHeaderUpstream(t *testing.T, name string) *headerUpstream {
	h := &headerUpstream{headers: map[int]string{}, ended: make(chan int, 16)}
	h.rawUpstream = newRawUpstream(t, func(n int, c net.Conn) {
		defer func() { h.ended <- n }()
		br := bufio.NewReader(c)
		first, err := br.Peek(5)
		if err != nil {
			return
		}
		hdr := ""
		if string(first) == "PROXY" || string(first) == proxyproto.Signature[:5] {
			if hdr, err = readProxyHeader(br); err != nil {
				return
			}
		}
		h.mu.Lock()
		h.headers[n] = hdr
		h.mu.Unlock()
		for {
			if _, err := readRequestHead(br); err != nil {
				return
			}
			body := fmt.Sprintf("%s%d", name, n)
			fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
		}
	})
	return h
}

func (h *headerUpstream) header(n int) string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.headers[n]
}

// TestProxyProtocolFollowsUpdate: a keep-alive client whose service is
// pointed at another upstream, or switched to another PROXY version (or
// to none), by Proxy.Update sends its next request as the new
// configuration says: the pinned connection to the old upstream or with
// the old header is closed, not reused.
func TestProxyProtocolFollowsUpdate(t *testing.T) {
	for _, tc := range []struct {
		name     string
		toB      bool
		version  proxyproto.Version
		wantBody string
		wantHdr  string // prefix of the new connection's header
	}{
		{"address", true, proxyproto.V1, "B1", "PROXY TCP4 "},
		{"version", false, proxyproto.V2, "A2", proxyproto.Signature},
		{"none", false, proxyproto.None, "A2", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, b := newHeaderUpstream(t, "A"), newHeaderUpstream(t, "B")
			p, addr := startProxy(t, nil, &exchange.Service{Upstream: a.addr(), ProxyProtocol: proxyproto.V1}, nil)
			c := dialClient(t, addr)
			c.send("GET / HTTP/1.1\r\nHost: a\r\n\r\n")
			if r, body := c.resp("GET"); r.StatusCode != 200 || body != "A1" {
				t.Fatalf("first: %d %q", r.StatusCode, body)
			}
			next := &exchange.Service{Name: "web", Upstream: a.addr(), ProxyProtocol: tc.version}
			if tc.toB {
				next.Upstream = b.addr()
			}
			if err := p.Update(Config{Config: exchange.Config{Services: []*exchange.Service{next}}}); err != nil {
				t.Fatal(err)
			}
			c.send("GET / HTTP/1.1\r\nHost: a\r\n\r\n")
			if r, body := c.resp("GET"); r.StatusCode != 200 || body != tc.wantBody {
				t.Fatalf("after update: %d %q, want %q", r.StatusCode, body, tc.wantBody)
			}
			up := a
			if tc.toB {
				up = b
			}
			n := int(tc.wantBody[1] - '0')
			if got := up.header(n); !strings.HasPrefix(got, tc.wantHdr) || (tc.wantHdr == "") != (got == "") {
				t.Fatalf("new connection's header %q, want prefix %q", got, tc.wantHdr)
			}
			// The old pinned connection is closed now, not when the
			// client leaves.
			select {
			case n := <-a.ended:
				if n != 1 {
					t.Fatalf("upstream A connection %d ended, want 1", n)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("the old pinned connection is still open")
			}
			if s := p.Stats(); s.UpstreamDiscarded != 0 {
				t.Fatalf("stats %+v: a reconfigured connection is not unclean", s)
			}
		})
	}
}

// readProxyHeader reads a v1 line or a whole v2 header.
func readProxyHeader(br *bufio.Reader) (string, error) {
	sig, err := br.Peek(len(proxyproto.Signature))
	if err != nil || string(sig) != proxyproto.Signature {
		return br.ReadString('\n')
	}
	fixed := make([]byte, 16)
	if _, err := io.ReadFull(br, fixed); err != nil {
		return "", err
	}
	rest := make([]byte, int(fixed[14])<<8|int(fixed[15]))
	if _, err := io.ReadFull(br, rest); err != nil {
		return "", err
	}
	return string(fixed) + string(rest), nil
}
