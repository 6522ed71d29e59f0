package proxy

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rl-tproxy/rl-tproxy/pkg/exchange"
)

// slowUpstream answers a request only once release is closed; until then
// it reports on upClosed when the proxy closes the connection (the
// exchange was cancelled). prefix is written at once after the head.
func slowUpstream(t *testing.T, prefix string) (up *rawUpstream, gotHead, upClosed chan struct{}, release chan struct{}) {
	gotHead = make(chan struct{}, 1)
	upClosed = make(chan struct{}, 1)
	release = make(chan struct{})
	up = newRawUpstream(t, func(_ int, c net.Conn) {
		br := bufio.NewReader(c)
		if _, err := readRequestHead(br); err != nil {
			return
		}
		if prefix != "" {
			io.WriteString(c, prefix)
		}
		gotHead <- struct{}{}
		eof := make(chan struct{})
		go func() { io.Copy(io.Discard, br); close(eof) }()
		select {
		case <-eof:
			upClosed <- struct{}{}
		case <-release:
			io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
		}
	})
	t.Cleanup(func() { close(release) }) // runs before the upstream's cleanup
	return up, gotHead, upClosed, release
}

// resetClose closes c with a TCP reset (SO_LINGER 0).
func resetClose(t *testing.T, c net.Conn) {
	t.Helper()
	if err := c.(*net.TCPConn).SetLinger(0); err != nil {
		t.Fatal(err)
	}
	c.Close()
}

func waitUpstreamClosed(t *testing.T, upClosed chan struct{}) {
	t.Helper()
	select {
	case <-upClosed:
	case <-time.After(10 * time.Second): // hang guard, not a threshold
		t.Fatal("the proxy did not cancel the upstream exchange after the client went away")
	}
}

// A client that resets while the proxy waits for the upstream's response
// head, or while the response body is relayed, is a client abort: the
// upstream exchange is cancelled (closed, not pooled) and Done sees
// ClientAborted.
func TestClientAbortWhileUpstreamWorks(t *testing.T) {
	t.Run("waiting-for-head", func(t *testing.T) {
		up, gotHead, upClosed, _ := slowUpstream(t, "")
		hook := newTestHook(nil)
		p, addr := startProxy(t, hook, &exchange.Service{Upstream: up.addr()}, nil)
		c := dialClient(t, addr)
		c.send("GET /slow HTTP/1.1\r\nHost: x\r\n\r\n")
		<-gotHead
		resetClose(t, c.c)
		waitUpstreamClosed(t, upClosed)
		d := hook.waitDone(t)
		if !d.clientAborted || d.status != 0 || d.upstreamErr != nil {
			t.Fatalf("done %+v", d)
		}
		if s := p.Stats(); s.UpstreamIdle != 0 {
			t.Fatalf("aborted exchange pooled: %+v", s)
		}
	})
	t.Run("after-request-body", func(t *testing.T) {
		up, gotHead, upClosed, _ := slowUpstream(t, "")
		hook := newTestHook(nil)
		p, addr := startProxy(t, hook, &exchange.Service{Upstream: up.addr()}, nil)
		c := dialClient(t, addr)
		c.send("POST /slow HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\n")
		<-gotHead // the body is read from the client after admission
		c.send("hello")
		resetClose(t, c.c)
		waitUpstreamClosed(t, upClosed)
		d := hook.waitDone(t)
		if !d.clientAborted || d.status != 0 || d.upstreamErr != nil {
			t.Fatalf("done %+v", d)
		}
		if s := p.Stats(); s.UpstreamIdle != 0 {
			t.Fatalf("aborted exchange pooled: %+v", s)
		}
	})
	t.Run("relaying-body", func(t *testing.T) {
		up, gotHead, upClosed, _ := slowUpstream(t, "HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n0123456789")
		hook := newTestHook(nil)
		p, addr := startProxy(t, hook, &exchange.Service{Upstream: up.addr()}, nil)
		c := dialClient(t, addr)
		c.send("GET /slow HTTP/1.1\r\nHost: x\r\n\r\n")
		<-gotHead
		r, err := http.ReadResponse(c.br, &http.Request{Method: "GET"})
		if err != nil {
			t.Fatal(err)
		}
		var part [10]byte
		if _, err := io.ReadFull(r.Body, part[:]); err != nil || string(part[:]) != "0123456789" {
			t.Fatalf("partial body %q %v", part, err)
		}
		resetClose(t, c.c)
		waitUpstreamClosed(t, upClosed)
		d := hook.waitDone(t)
		if !d.clientAborted || d.status != 200 || d.upstreamErr != nil {
			t.Fatalf("done %+v", d)
		}
		if s := p.Stats(); s.UpstreamIdle != 0 {
			t.Fatalf("aborted exchange pooled: %+v", s)
		}
	})
}

// A client that shuts down its write side after a complete request,
// while the upstream works on it, aborts it: no answer, a client abort,
// and the upstream connection closed (the exchange is cancelled).
func TestClientHalfCloseWhileUpstreamWorks(t *testing.T) {
	up, gotHead, upClosed, _ := slowUpstream(t, "")
	hook := newTestHook(nil)
	_, addr := startProxy(t, hook, &exchange.Service{Upstream: up.addr()}, nil)
	c := dialClient(t, addr)
	c.send("GET /slow HTTP/1.1\r\nHost: x\r\n\r\n")
	<-gotHead
	if err := c.c.(*net.TCPConn).CloseWrite(); err != nil {
		t.Fatal(err)
	}
	c.expectClosed()
	d := hook.waitDone(t)
	if !d.clientAborted || d.status != 0 {
		t.Fatalf("done %+v, want a client abort", d)
	}
	recvWithin(t, upClosed, "the upstream connection to close")
}

func TestClientAbort(t *testing.T) {
	t.Run("mid-body", func(t *testing.T) {
		gotBody := make(chan int, 1)
		gotHead := make(chan struct{})
		up := newRawUpstream(t, func(_ int, c net.Conn) {
			br := bufio.NewReader(c)
			if _, err := readRequestHead(br); err != nil {
				return
			}
			close(gotHead)
			n, _ := io.Copy(io.Discard, br)
			gotBody <- int(n)
		})
		hook := newTestHook(nil)
		p, addr := startProxy(t, hook, &exchange.Service{Upstream: up.addr()}, nil)
		c := dialClient(t, addr)
		c.send("POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n0123456789")
		<-gotHead // the upstream was reached: now go away mid-body
		c.c.Close()
		d := hook.waitDone(t)
		if !d.clientAborted || d.bytesIn != 10 {
			t.Fatalf("done %+v", d)
		}
		if n := <-gotBody; n != 10 {
			t.Fatalf("upstream got %d body bytes and must see the close", n)
		}
		if s := p.Stats(); s.UpstreamIdle != 0 {
			t.Fatalf("aborted exchange pooled: %+v", s)
		}
	})
	t.Run("during-admission", func(t *testing.T) {
		entered := make(chan struct{})
		var sawCancel atomic.Bool
		hook := newTestHook(func(ctx context.Context, r *exchange.Request) exchange.Decision {
			close(entered)
			select {
			case <-ctx.Done():
				sawCancel.Store(true)
			case <-time.After(20 * time.Second):
			}
			return exchange.Decision{Allow: true}
		})
		up := newRawUpstream(t, func(int, net.Conn) {})
		_, addr := startProxy(t, hook, &exchange.Service{Upstream: up.addr()}, nil)
		c := dialClient(t, addr)
		c.send("GET / HTTP/1.1\r\nHost: x\r\n\r\n")
		<-entered
		c.c.Close()
		d := hook.waitDone(t)
		if !sawCancel.Load() || !d.clientAborted || d.status != 0 {
			t.Fatalf("cancel seen %v, done %+v", sawCancel.Load(), d)
		}
		if up.count() != 0 {
			t.Fatal("aborted request reached the upstream")
		}
	})
}

func hookWaitAdmit(t *testing.T, h *testHook, n int) {
	t.Helper()
	for i := 0; i < 1000000; i++ {
		if len(h.admitted()) >= n {
			return
		}
		runtime.Gosched()
	}
	t.Fatalf("admission %d not reached", n)
}

// A client that goes away while admission waits is noticed even when its
// request body is already queued unread.
func TestClientAbortDuringAdmissionWithBody(t *testing.T) {
	entered := make(chan struct{})
	hook := newTestHook(func(ctx context.Context, r *exchange.Request) exchange.Decision {
		close(entered)
		select {
		case <-ctx.Done():
		case <-time.After(20 * time.Second):
		}
		return exchange.Decision{Allow: true}
	})
	up := newRawUpstream(t, func(int, net.Conn) {})
	_, addr := startProxy(t, hook, &exchange.Service{Upstream: up.addr()}, nil)
	c := dialClient(t, addr)
	c.send("POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n")
	<-entered
	c.send(strings.Repeat("b", 1000)) // unread body bytes while Admit waits
	c.c.Close()
	if d := hook.waitDone(t); !d.clientAborted || d.status != 0 {
		t.Fatalf("done %+v", d)
	}
	if up.count() != 0 {
		t.Fatal("aborted request reached the upstream")
	}
}
