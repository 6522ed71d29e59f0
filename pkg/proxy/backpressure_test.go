package proxy

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/rl-tproxy/rl-tproxy/internal/testkit"
	"github.com/rl-tproxy/rl-tproxy/pkg/exchange"
	"github.com/rl-tproxy/rl-tproxy/pkg/httpparse"
)

// stalledUpstream accepts one connection with a small receive buffer
// and reads nothing from it until read is closed; then it reads one
// request (head and a 5-byte body), reports on got and answers "ok"
// once release is closed.
func stalledUpstream(t *testing.T) (addr string, read, got, release chan struct{}) {
	t.Helper()
	lc := net.ListenConfig{Control: sockBuf(unix.SO_RCVBUF)}
	ln, err := lc.Listen(context.Background(), "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	read, got, release = make(chan struct{}), make(chan struct{}, 1), make(chan struct{})
	done, stop := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		select {
		case <-read:
		case <-stop:
			return
		}
		br := bufio.NewReader(c)
		if _, err := readRequestHead(br); err != nil {
			return
		}
		if _, err := io.ReadFull(br, make([]byte, 5)); err != nil {
			return
		}
		got <- struct{}{}
		select {
		case <-release:
		case <-stop:
			return
		}
		io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
		io.Copy(io.Discard, br)
	}()
	t.Cleanup(func() { close(stop); ln.Close(); <-done })
	return ln.Addr().String(), read, got, release
}

// sockBuf is a net.ListenConfig or net.Dialer Control that sets the
// socket buffer opt (SO_RCVBUF, SO_SNDBUF) small, which also stops the
// kernel from growing it.
func sockBuf(opt int) func(_, _ string, rc syscall.RawConn) error {
	return func(_, _ string, rc syscall.RawConn) error {
		var serr error
		err := rc.Control(func(fd uintptr) { serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, opt, 4096) })
		if err != nil {
			return err
		}
		return serr
	}
}

// bigHeadRequest is a POST whose head is n bytes or more (so that it
// alone fills the upstream socket's queue past loopMaxPending while the
// upstream does not read) with a 5-byte body, and the service limits
// that take it.
func bigHeadRequest(n int) (head string, lim httpparse.Limits) {
	var sb strings.Builder
	sb.WriteString("POST /big HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n")
	v := strings.Repeat("v", 16<<10)
	for i := 0; sb.Len() < n; i++ {
		fmt.Fprintf(&sb, "X-Fill-%d: %s\r\n", i, v)
	}
	sb.WriteString("\r\n")
	return sb.String(), httpparse.Limits{MaxHeaderBytes: 2 * n, MaxHeaders: 1000}
}

// A client paused because the upstream socket held more than
// loopMaxPending is read again once that queue drained, also when its
// body is complete: its FIN is seen while the response is awaited, which
// aborts the request. That holds too when its last body byte was what
// pushed the queue over the bound (it must not stay paused for the whole
// exchange).
func TestClientReadAfterBodyUnderBackpressure(t *testing.T) {
	eachLoopBackend(t, func(t *testing.T) {
		up, read, got, release := stalledUpstream(t)
		defer close(release)
		head, lim := bigHeadRequest(1 << 20)
		hook := newTestHook(nil)
		p, addr := startProxy(t, hook, &exchange.Service{Upstream: up, Limits: lim}, func(cfg *Config) {
			cfg.Dial = (&net.Dialer{Control: sockBuf(unix.SO_SNDBUF)}).DialContext
		})
		c := dialClient(t, addr)
		c.send(head)
		waitConnState(t, p, lcExchange) // the head is queued for the upstream
		c.send("hello")
		// The head alone filled the upstream socket's queue: the client is
		// paused before its body, or after it.
		testkit.WaitFor(t, "the client to be paused", func() bool {
			paused := false
			loopConn(p, func(c *clientConn) { paused = c.state == lcExchange && c.paused && c.r.up.s.Pending() > loopMaxPending })
			return paused
		})
		close(read) // the upstream reads: the queue drains
		recvWithin(t, got, "the upstream to read the request")
		if err := c.c.(*net.TCPConn).CloseWrite(); err != nil {
			t.Fatal(err)
		}
		c.expectClosed() // the FIN was read before any response: an abort
		if d := hook.waitDone(t); !d.clientAborted || d.status != 0 || d.bytesIn != 5 {
			t.Fatalf("done %+v, want a client abort after the whole body", d)
		}
	})
}

// A client paused because its whole body filled the buffer while the
// upstream was dialled reads again once upReady took the body out: its
// FIN is seen while the response is awaited, which aborts the request
// (it must not stay paused for the whole exchange).
func TestClientReadAfterBufferedBodySent(t *testing.T) {
	eachLoopBackend(t, func(t *testing.T) {
		up, _, gotBody, release, cancelled := holdUpstream(t)
		defer close(release)
		dial := make(chan struct{})
		hook := newTestHook(nil)
		p, addr := startProxy(t, hook, &exchange.Service{Upstream: up}, func(cfg *Config) { cfg.Dial = heldDial(dial) })
		c := dialClient(t, addr)
		body := strings.Repeat("b", 20<<10) // buffered whole, with less than a read's room left
		c.send("POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: 20480\r\n\r\n" + body)
		testkit.WaitFor(t, "the client to be paused with its body buffered", func() bool {
			paused := false
			loopConn(p, func(c *clientConn) { paused = c.state == lcUpstream && c.paused })
			return paused
		})
		if err := c.c.(*net.TCPConn).CloseWrite(); err != nil {
			t.Fatal(err)
		}
		close(dial)
		recvWithin(t, gotBody, "the upstream to get the body")
		c.expectClosed()
		if d := hook.waitDone(t); !d.clientAborted || d.status != 0 {
			t.Fatalf("done %+v, want a client abort", d)
		}
		recvWithin(t, cancelled, "the upstream exchange to be cancelled")
	})
}

// A client that keeps pipelining requests while a large response is
// relayed (and not read) is paused once its buffer cannot take another
// read: memory stays bounded by the buffer, and every request is served
// once the client reads. (A guard for the resumes above: each must leave
// a client with a full buffer paused.)
func TestPipelinedRequestsBoundedDuringLargeResponse(t *testing.T) {
	eachLoopBackend(t, func(t *testing.T) {
		const big = 8 << 20
		up := httpUpstream(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path == "/big" {
				w.Header().Set("Content-Length", fmt.Sprint(big))
				w.Write(make([]byte, big))
				return
			}
			io.WriteString(w, "p")
		}))
		p, addr := startProxy(t, nil, &exchange.Service{Upstream: up}, nil)
		c := dialClient(t, addr)
		c.send("GET /big HTTP/1.1\r\nHost: x\r\n\r\n")
		const n = 4000 // ~110 KiB of requests: more than the buffer holds
		req := "GET /p HTTP/1.1\r\nHost: x\r\n\r\n"
		sent := make(chan error, 1)
		go func() { _, err := io.WriteString(c.c, strings.Repeat(req, n)); sent <- err }()
		var held, size int
		testkit.WaitFor(t, "the client to be paused with its buffer full", func() bool {
			paused := false
			loopConn(p, func(c *clientConn) {
				if c.state == lcExchange && c.paused && c.r.bodyDone && !c.canRead() {
					paused, held, size = true, c.buf.w-c.buf.r, len(c.buf.b)
				}
			})
			return paused
		})
		// Paused with the buffer full while requests are still being sent:
		// the rest waits in the kernel. (The buffer is the loop's, or grown
		// once for what io_uring received in the turn of a pause, which
		// evloop bounds.)
		if held > size || held < size-loopReadSize-4096 { // 4096: room for the head of the request in flight
			t.Fatalf("paused holding %d bytes in a %d-byte buffer", held, size)
		}
		r, err := http.ReadResponse(c.br, &http.Request{Method: "GET"})
		if err != nil {
			t.Fatal(err)
		}
		if k, err := io.Copy(io.Discard, r.Body); err != nil || k != big {
			t.Fatalf("big body: %d bytes, %v", k, err)
		}
		for i := range n {
			if r, body := c.resp("GET"); r.StatusCode != 200 || body != "p" {
				t.Fatalf("pipelined response %d: %d %q", i, r.StatusCode, body)
			}
		}
		if err := recvWithin(t, sent, "the pipelined requests to be written"); err != nil {
			t.Fatal(err)
		}
	})
}
