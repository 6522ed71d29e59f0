package proxy

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/rl-tproxy/rl-tproxy/internal/testkit"
	"github.com/rl-tproxy/rl-tproxy/pkg/exchange"
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
func loopConn(p *Proxy, fn func(c *clientConn)) {
	p.lg.each(func(ls *loopState) {
		for c := ls.conns.head; c != nil; c = c.next {
			fn(c)
		}
	})
}

// waitConnState waits until p's only client connection is in state.
func waitConnState(t *testing.T, p *Proxy, state uint8) {
	t.Helper()
	testkit.WaitFor(t, "the client connection's state", func() bool {
		ok := false
		loopConn(p, func(c *clientConn) { ok = ok || c.state == state })
		return ok
	})
}

// holdUpstream is an upstream that reads the request with its body and
// answers "got:<body>" once release is closed; it reports on gotHead
// when its handler starts (the head arrived), on gotBody once it read
// the whole body, and on cancelled when the proxy dropped the exchange
// before release (its request context ended).
func holdUpstream(t *testing.T) (addr string, gotHead, gotBody, release, cancelled chan struct{}) {
	gotHead, gotBody, release, cancelled = make(chan struct{}, 1), make(chan struct{}, 1), make(chan struct{}), make(chan struct{}, 1)
	addr = httpUpstream(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		gotHead <- struct{}{}
		b, err := io.ReadAll(r.Body)
		if err != nil {
			cancelled <- struct{}{}
			return
		}
		gotBody <- struct{}{}
		select {
		case <-release:
		case <-r.Context().Done():
			cancelled <- struct{}{}
			return
		}
		w.Write(append([]byte("got:"), b...))
	}))
	return addr, gotHead, gotBody, release, cancelled
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
	complete         bool
}{
	{"no-body", "GET /x HTTP/1.1\r\nHost: x\r\n\r\n", "", true},
	{"content-length", "POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\n", "hello", true},
	{"chunked", "POST /x HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n", "5\r\nhello\r\n0\r\n\r\n", true},
	{"content-length-short", "POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\n", "hel", false},
	{"chunked-short", "POST /x HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n", "5\r\nhel", false},
	{"chunked-no-last-chunk", "POST /x HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n", "5\r\nhello\r\n", false},
}

// A client that shuts down its write side (FIN) while its request is in
// flight aborts it, as nginx does by default: whether the FIN arrives
// while the proxy waits for its upstream connection or for the response,
// and whether the body was complete or not, nothing is answered, Done
// sees ClientAborted and the upstream exchange is dropped.
func TestHalfCloseAborts(t *testing.T) {
	eachLoopBackend(t, func(t *testing.T) {
		for _, tc := range halfCloseBodies {
			t.Run("dialing/"+tc.name, func(t *testing.T) {
				up, _, _, release, _ := holdUpstream(t)
				close(release)
				dial := make(chan struct{})
				hook := newTestHook(nil)
				p, addr := startProxy(t, hook, &exchange.Service{Upstream: up}, func(cfg *Config) { cfg.Dial = heldDial(dial) })
				c := dialClient(t, addr)
				c.send(tc.head)
				waitConnState(t, p, lcUpstream)
				c.send(tc.body)
				if err := c.c.(*net.TCPConn).CloseWrite(); err != nil {
					t.Fatal(err)
				}
				checkHalfCloseAbort(t, c, hook)
				close(dial)
				testkit.WaitFor(t, "the proxy to hold no connection", func() bool { return p.Stats().Conns == 0 })
			})
			t.Run("awaiting-response/"+tc.name, func(t *testing.T) {
				up, gotHead, gotBody, release, cancelled := holdUpstream(t)
				defer close(release)
				hook := newTestHook(nil)
				_, addr := startProxy(t, hook, &exchange.Service{Upstream: up}, nil)
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
				checkHalfCloseAbort(t, c, hook)
				recvWithin(t, cancelled, "the upstream exchange to be cancelled")
			})
		}
	})
}

func checkHalfCloseAbort(t *testing.T, c *client, hook *testHook) {
	t.Helper()
	c.expectClosed()
	if d := hook.waitDone(t); !d.clientAborted || d.status != 0 {
		t.Fatalf("FIN with the request in flight: done %+v, want a client abort with nothing answered", d)
	}
}

// A FIN with part of a head buffered ends the connection without an
// answer and is counted as the rejection "client-abort" (status 0: no
// request existed to log or report); a FIN on an idle connection is no
// rejection.
func TestHalfCloseMidHead(t *testing.T) {
	eachLoopBackend(t, func(t *testing.T) {
		for _, tc := range []struct {
			name, sent string
			want       []string
		}{
			{"mid-head", "GET /x HTTP/1.1\r\nHo", []string{"client-abort:0"}},
			{"idle", "", nil},
		} {
			t.Run(tc.name, func(t *testing.T) {
				up := newRawUpstream(t, func(int, net.Conn) {})
				rec := &rejectRecorder{}
				p, addr := startProxy(t, rec, &exchange.Service{Upstream: up.addr()}, nil)
				c := dialClient(t, addr)
				c.send(tc.sent)
				if tc.sent != "" {
					waitConnState(t, p, lcHead)
				}
				if err := c.c.(*net.TCPConn).CloseWrite(); err != nil {
					t.Fatal(err)
				}
				c.expectClosed()
				testkit.WaitFor(t, "the proxy to hold no connection", func() bool { return p.Stats().Conns == 0 })
				if got := rec.seen(); fmt.Sprint(got) != fmt.Sprint(tc.want) {
					t.Fatalf("rejects %q, want %q", got, tc.want)
				}
				if up.count() != 0 {
					t.Fatalf("the upstream saw %d connections", up.count())
				}
			})
		}
	})
}

// Abuse: many clients that each send a request and half-close while the
// upstream works on it leave nothing behind: every request is a client
// abort, every upstream exchange is cancelled, no upstream connection is
// pooled and the proxy holds no connection.
func TestHalfCloseAbortFlood(t *testing.T) {
	const n = 32
	up, gotHead, gotBody, release, cancelled := holdUpstream(t)
	defer close(release)
	hook := newTestHook(nil)
	p, addr := startProxy(t, hook, &exchange.Service{Upstream: up}, nil)
	for i := 0; i < n; i++ {
		c := dialClient(t, addr)
		c.send("GET /x HTTP/1.1\r\nHost: x\r\n\r\n")
		recvWithin(t, gotHead, "the upstream to get the head")
		recvWithin(t, gotBody, "the upstream to read the (empty) body")
		if err := c.c.(*net.TCPConn).CloseWrite(); err != nil {
			t.Fatal(err)
		}
		c.expectClosed()
		if d := hook.waitDone(t); !d.clientAborted || d.status != 0 {
			t.Fatalf("request %d: done %+v, want a client abort", i, d)
		}
		recvWithin(t, cancelled, "the upstream exchange to be cancelled")
	}
	testkit.WaitFor(t, "the proxy to hold no connection", func() bool {
		s := p.Stats()
		return s.Conns == 0 && s.UpstreamIdle == 0
	})
}
