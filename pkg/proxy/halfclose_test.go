package proxy

import (
	"context"
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/rl-tproxy/rl-tproxy/internal/testkit"
)

// recvWithin receives from ch or fails t; the bound is a hang guard, not
// a timing threshold.
func recvWithin[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(20 * time.Second):
		t.Fatalf("timed out waiting for %s", what)
	}
	var zero T
	return zero
}

// loopConn runs fn on the loop thread of every client connection of p
// and waits for it.
func loopConn(p *Proxy, fn func(c *lconn)) {
	p.lg.each(func(ls *loopState) {
		for c := ls.conns.head; c != nil; c = c.next {
			fn(c)
		}
	})
}

// clientFINSeen reports whether p's only client connection saw its
// client's FIN, or is gone (a FIN taken for an abort).
func clientFINSeen(p *Proxy) bool {
	seen, n := false, 0
	loopConn(p, func(c *lconn) {
		n++
		seen = seen || c.eof
	})
	return seen || n == 0
}

// waitConnState waits until p's only client connection is in state.
func waitConnState(t *testing.T, p *Proxy, state uint8) {
	t.Helper()
	testkit.WaitFor(t, "the client connection's state", func() bool {
		ok := false
		loopConn(p, func(c *lconn) { ok = ok || c.state == state })
		return ok
	})
}

// holdUpstream is an upstream that reads the request with its body and
// answers "got:<body>" once release is closed; it reports on gotHead
// when its handler starts (the head arrived) and on gotBody once it read
// the whole body.
func holdUpstream(t *testing.T) (addr string, gotHead, gotBody, release chan struct{}) {
	gotHead, gotBody, release = make(chan struct{}, 1), make(chan struct{}, 1), make(chan struct{})
	addr = httpUpstream(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		gotHead <- struct{}{}
		b, err := io.ReadAll(r.Body)
		if err != nil {
			return
		}
		gotBody <- struct{}{}
		select {
		case <-release:
		case <-r.Context().Done():
			return
		}
		w.Write(append([]byte("got:"), b...))
	}))
	return addr, gotHead, gotBody, release
}

// heldDial is a Config.Dial that waits until release is closed: the
// request waits for its upstream connection (state lcUpstream) meanwhile.
func heldDial(release chan struct{}) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		select {
		case <-release:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		var d net.Dialer
		return d.DialContext(ctx, network, addr)
	}
}

var halfCloseBodies = []struct {
	name, head, body string // body: all of it (complete) or its start (incomplete)
	want             string
	complete         bool
}{
	{"no-body", "GET /x HTTP/1.1\r\nHost: x\r\n\r\n", "", "got:", true},
	{"content-length", "POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\n", "hello", "got:hello", true},
	{"chunked", "POST /x HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n", "5\r\nhello\r\n0\r\n\r\n", "got:hello", true},
	{"content-length-short", "POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\n", "hel", "", false},
	{"chunked-short", "POST /x HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n", "5\r\nhel", "", false},
	{"chunked-no-last-chunk", "POST /x HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n", "5\r\nhello\r\n", "", false},
}

// A client that shuts down its write side (FIN) after a complete request
// gets the response, whether the FIN arrives while the proxy waits for
// its upstream connection or for the response; a FIN before the body is
// complete is a client abort (Done sees ClientAborted, nothing is
// answered).
func TestHalfCloseAfterRequest(t *testing.T) {
	eachLoopBackend(t, func(t *testing.T) {
		for _, tc := range halfCloseBodies {
			t.Run("dialing/"+tc.name, func(t *testing.T) {
				up, _, _, release := holdUpstream(t)
				close(release)
				dial := make(chan struct{})
				hook := newTestHook(nil)
				p, addr := startProxy(t, hook, &Service{Upstream: up}, func(cfg *Config) { cfg.Dial = heldDial(dial) })
				c := dialClient(t, addr)
				c.send(tc.head)
				waitConnState(t, p, lcUpstream) // admitted: the FIN is not one during admission
				c.send(tc.body)
				if err := c.c.(*net.TCPConn).CloseWrite(); err != nil {
					t.Fatal(err)
				}
				testkit.WaitFor(t, "the proxy to read the FIN", func() bool { return clientFINSeen(p) })
				close(dial)
				checkHalfClose(t, c, hook, tc.want, tc.complete)
			})
			t.Run("awaiting-response/"+tc.name, func(t *testing.T) {
				up, gotHead, gotBody, release := holdUpstream(t)
				hook := newTestHook(nil)
				p, addr := startProxy(t, hook, &Service{Upstream: up}, nil)
				c := dialClient(t, addr)
				c.send(tc.head)
				recvWithin(t, gotHead, "the upstream to get the head")
				c.send(tc.body)
				if tc.complete {
					recvWithin(t, gotBody, "the upstream to get the body")
				}
				if err := c.c.(*net.TCPConn).CloseWrite(); err != nil {
					t.Fatal(err)
				}
				testkit.WaitFor(t, "the proxy to read the FIN", func() bool { return clientFINSeen(p) })
				close(release)
				checkHalfClose(t, c, hook, tc.want, tc.complete)
			})
		}
	})
}

func checkHalfClose(t *testing.T, c *client, hook *testHook, want string, complete bool) {
	t.Helper()
	if !complete {
		c.expectClosed()
		if d := hook.waitDone(t); !d.clientAborted || d.status != 0 {
			t.Fatalf("FIN before the body ended: done %+v, want a client abort", d)
		}
		return
	}
	r, body := c.resp("GET")
	if r.StatusCode != 200 || body != want || !r.Close {
		t.Fatalf("response %d %q (close %v), want 200 %q with Connection: close", r.StatusCode, body, r.Close, want)
	}
	c.expectClosed()
	if d := hook.waitDone(t); d.clientAborted || d.status != 200 {
		t.Fatalf("done %+v", d)
	}
}
