package proxy

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rl-tproxy/rl-tproxy/internal/testkit"
	"github.com/rl-tproxy/rl-tproxy/pkg/exchange"
)

func TestUpstreamCloseMidBody(t *testing.T) {
	up := newRawUpstream(t, func(_ int, c net.Conn) {
		br := bufio.NewReader(c)
		if _, err := readRequestHead(br); err != nil {
			return
		}
		io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n0123456789")
	})
	hook := newTestHook(nil)
	_, addr := startProxy(t, hook, &exchange.Service{Upstream: up.addr()}, nil)
	c := dialClient(t, addr)
	c.send("GET / HTTP/1.1\r\nHost: x\r\n\r\n")
	r, err := http.ReadResponse(c.br, nil)
	if err != nil || r.StatusCode != 200 {
		t.Fatalf("%v %v", r, err)
	}
	b, err := io.ReadAll(r.Body)
	if string(b) != "0123456789" || !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("body %q err %v: the client must see a truncated body", b, err)
	}
	d := hook.waitDone(t)
	if d.upstreamErr == nil || d.clientAborted || d.status != 200 {
		t.Fatalf("done %+v", d)
	}
}

// keepAliveUpstream answers every request with 200 "ok"; for connection
// number breakAt it reads the second request and closes without answering.
func keepAliveUpstream(t *testing.T, breakAt int) *rawUpstream {
	return newRawUpstream(t, func(n int, c net.Conn) {
		br := bufio.NewReader(c)
		for i := 0; ; i++ {
			head, err := readRequestHead(br)
			if err != nil {
				return
			}
			if cl := headerOf(head, "Content-Length"); cl != "" {
				k, _ := strconv.Atoi(cl)
				io.CopyN(io.Discard, br, int64(k))
			}
			if n == breakAt && i == 1 {
				return
			}
			fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nX-Conn: %d\r\n\r\nok", n)
		}
	})
}

func headerOf(head, name string) string {
	for _, l := range strings.Split(head, "\r\n") {
		if k, v, ok := strings.Cut(l, ":"); ok && strings.EqualFold(k, name) {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

func TestUpstreamPool(t *testing.T) {
	t.Run("reuse", func(t *testing.T) {
		up := keepAliveUpstream(t, 0)
		p, addr := startProxy(t, nil, &exchange.Service{Upstream: up.addr()}, nil)
		for i := 0; i < 3; i++ {
			c := dialClient(t, addr)
			c.send("GET / HTTP/1.1\r\nHost: x\r\n\r\n")
			if r, _ := c.resp("GET"); r.StatusCode != 200 {
				t.Fatal(r.Status)
			}
		}
		// Each event loop has its own pool: one connection per loop
		// at most.
		if n := up.count(); n < 1 || n > p.ListenGroupSize() {
			t.Fatalf("upstream connections: %d, want 1 (per event loop)", n)
		}
	})
	t.Run("retry-once-idempotent", func(t *testing.T) {
		up := keepAliveUpstream(t, 1)
		hook := newTestHook(nil)
		_, addr := startProxy(t, hook, &exchange.Service{Upstream: up.addr()}, nil)
		c := dialClient(t, addr)
		for i := 0; i < 2; i++ {
			c.send("GET / HTTP/1.1\r\nHost: x\r\n\r\n")
			r, body := c.resp("GET")
			if r.StatusCode != 200 || body != "ok" {
				t.Fatalf("request %d: %d %q", i, r.StatusCode, body)
			}
			hook.waitDone(t)
		}
		if up.count() != 2 {
			t.Fatalf("upstream connections %d, want 2 (one retry)", up.count())
		}
	})
	t.Run("no-retry-with-body", func(t *testing.T) {
		up := keepAliveUpstream(t, 1)
		hook := newTestHook(nil)
		_, addr := startProxy(t, hook, &exchange.Service{Upstream: up.addr()}, nil)
		c := dialClient(t, addr)
		c.send("GET / HTTP/1.1\r\nHost: x\r\n\r\n")
		c.resp("GET")
		hook.waitDone(t)
		c.send("POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabc")
		r, _ := c.resp("POST")
		if r.StatusCode != 502 {
			t.Fatalf("status %d, want 502 (POST is not replayed)", r.StatusCode)
		}
		if d := hook.waitDone(t); d.upstreamErr == nil {
			t.Fatalf("done %+v", d)
		}
		if up.count() != 1 {
			t.Fatalf("upstream connections %d, want 1", up.count())
		}
	})
	t.Run("dial-failure-502", func(t *testing.T) {
		dead := testkit.RefusedAddr(t)
		_, addr := startProxy(t, nil, &exchange.Service{Upstream: dead}, nil)
		c := dialClient(t, addr)
		c.send("GET / HTTP/1.1\r\nHost: x\r\n\r\n")
		if r, _ := c.resp("GET"); r.StatusCode != 502 {
			t.Fatalf("status %d", r.StatusCode)
		}
	})
	t.Run("custom-dial", func(t *testing.T) {
		up := keepAliveUpstream(t, 0)
		var dials atomic.Int32
		_, addr := startProxy(t, nil, &exchange.Service{Upstream: "upstream.invalid:80"}, func(cfg *Config) {
			cfg.Dial = func(ctx context.Context, network, _ string) (net.Conn, error) {
				dials.Add(1)
				var d net.Dialer
				return d.DialContext(ctx, network, up.addr())
			}
		})
		c := dialClient(t, addr)
		c.send("GET / HTTP/1.1\r\nHost: x\r\n\r\n")
		if r, _ := c.resp("GET"); r.StatusCode != 200 || dials.Load() != 1 {
			t.Fatalf("status %d dials %d", r.StatusCode, dials.Load())
		}
	})
}

func TestLargeBodiesAndCloseDelimited(t *testing.T) {
	big := strings.Repeat("0123456789abcdef", 20000) // 320 000 bytes: the splice path
	up := newRawUpstream(t, func(_ int, c net.Conn) {
		br := bufio.NewReader(c)
		for {
			head, err := readRequestHead(br)
			if err != nil {
				return
			}
			n, _ := strconv.Atoi(headerOf(head, "Content-Length"))
			body := make([]byte, n)
			if _, err := io.ReadFull(br, body); err != nil {
				return
			}
			if strings.HasPrefix(head, "GET /close") {
				// HTTP/1.0-style close-delimited body.
				io.WriteString(c, "HTTP/1.1 200 OK\r\n\r\n"+big)
				return
			}
			fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s", len(body)+len(big), body)
			io.WriteString(c, big)
		}
	})
	hook := newTestHook(nil)
	_, addr := startProxy(t, hook, &exchange.Service{Upstream: up.addr()}, nil)
	c := dialClient(t, addr)
	c.send(fmt.Sprintf("POST /big HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s", len(big), big))
	r, body := c.resp("POST")
	if r.StatusCode != 200 || body != big+big || r.Close {
		t.Fatalf("big: %d len %d close %v", r.StatusCode, len(body), r.Close)
	}
	if d := hook.waitDone(t); d.bytesIn != int64(len(big)) || d.bytesOut < int64(2*len(big)) {
		t.Fatalf("done %+v", d)
	}
	c.send("GET /close HTTP/1.1\r\nHost: x\r\n\r\n")
	r, body = c.resp("GET")
	if r.StatusCode != 200 || body != big || !r.Close {
		t.Fatalf("close-delimited: %d len %d close %v", r.StatusCode, len(body), r.Close)
	}
	hook.waitDone(t)
	c.expectClosed()
}

func TestUpstreamHealthAndIdleTimeout(t *testing.T) {
	t.Run("closed-pooled-conn-discarded", func(t *testing.T) {
		closed := make(chan struct{}, 4)
		up := newRawUpstream(t, func(n int, c net.Conn) {
			br := bufio.NewReader(c)
			head, err := readRequestHead(br)
			if err != nil {
				return
			}
			if k, _ := strconv.Atoi(headerOf(head, "Content-Length")); k > 0 {
				io.CopyN(io.Discard, br, int64(k))
			}
			io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
			c.Close() // silently, without Connection: close
			closed <- struct{}{}
		})
		p, addr := startProxy(t, nil, &exchange.Service{Upstream: up.addr()}, nil)
		c := dialClient(t, addr)
		c.send("GET / HTTP/1.1\r\nHost: x\r\n\r\n")
		c.resp("GET")
		<-closed // the FIN is queued at the proxy's pooled socket now
		// A POST is never retried: only the pre-use check saves it.
		c.send("POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabc")
		if r, body := c.resp("POST"); r.StatusCode != 200 || body != "ok" {
			t.Fatalf("POST on a checked pool: %d %q", r.StatusCode, body)
		}
		// A pooled connection stays registered with its loop: the second
		// one's close is seen (and counted) while it idles.
		want := uint64(2)
		for end := time.Now().Add(10 * time.Second); p.Stats().UpstreamDiscarded < want && time.Now().Before(end); {
			runtime.Gosched()
		}
		if up.count() != 2 || p.Stats().UpstreamDiscarded != want {
			t.Fatalf("upstream connections %d, stats %+v; want 2 and %d discarded", up.count(), p.Stats(), want)
		}
	})
	// A clean connection found expired at reuse (before the prune timer
	// closed it) is closed and replaced, but it was not unclean: it is
	// not counted as discarded.
	t.Run("expired-at-reuse-not-discarded", func(t *testing.T) {
		up := newRawUpstream(t, func(_ int, c net.Conn) {
			br := bufio.NewReader(c)
			for {
				if _, err := readRequestHead(br); err != nil {
					return
				}
				io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
			}
		})
		p, addr := startProxy(t, nil, &exchange.Service{Upstream: up.addr()}, func(cfg *Config) {
			cfg.UpstreamIdleTimeout = time.Hour
		})
		c := dialClient(t, addr)
		c.send("GET / HTTP/1.1\r\nHost: x\r\n\r\n")
		c.resp("GET")
		// The connection is pooled just after the response reached
		// the client: wait (bounded) until it is.
		for end := time.Now().Add(10 * time.Second); ageIdle(p, 2*time.Hour) != 1; {
			if time.Now().After(end) {
				t.Fatalf("stats %+v: the upstream connection was never pooled", p.Stats())
			}
			runtime.Gosched()
		}
		c.send("GET / HTTP/1.1\r\nHost: x\r\n\r\n")
		if r, body := c.resp("GET"); r.StatusCode != 200 || body != "ok" {
			t.Fatalf("after expiry: %d %q", r.StatusCode, body)
		}
		if up.count() != 2 || p.Stats().UpstreamDiscarded != 0 {
			t.Fatalf("upstream connections %d, stats %+v; want 2 and none discarded", up.count(), p.Stats())
		}
	})
	t.Run("idle-timeout-prunes", func(t *testing.T) {
		gone := make(chan struct{}, 1)
		up := newRawUpstream(t, func(_ int, c net.Conn) {
			br := bufio.NewReader(c)
			for {
				if _, err := readRequestHead(br); err != nil {
					gone <- struct{}{} // the proxy closed its pooled connection
					return
				}
				io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
			}
		})
		p, addr := startProxy(t, nil, &exchange.Service{Upstream: up.addr()}, func(cfg *Config) {
			cfg.UpstreamIdleTimeout = 20 * time.Millisecond
		})
		c := dialClient(t, addr)
		c.send("GET / HTTP/1.1\r\nHost: x\r\n\r\n")
		c.resp("GET")
		<-gone
		if s := p.Stats(); s.UpstreamIdle != 0 {
			t.Fatalf("stats %+v", s)
		}
	})
}

// ageIdle moves the idle-since time of p's pooled upstream connections
// back by d and returns how many there are.
func ageIdle(p *Proxy, d time.Duration) int {
	var n atomic.Int64
	p.lg.each(func(ls *loopState) {
		for _, pl := range ls.pools {
			for _, u := range pl.idle {
				u.idleSince -= int64(d)
				n.Add(1)
			}
		}
	})
	return int(n.Load())
}
