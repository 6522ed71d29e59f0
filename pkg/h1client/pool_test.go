package h1client_test

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/rl-tproxy/rl-tproxy/internal/testkit"
	"github.com/rl-tproxy/rl-tproxy/pkg/h1client"
	"github.com/rl-tproxy/rl-tproxy/pkg/httpparse"
)

// TestPoolReusesConnection: sequential requests share one pooled
// connection; each gets its own response.
func TestPoolReusesConnection(t *testing.T) {
	u := newUpstream()
	u.start(t, u.serveEach(func(_ int, req *http.Request, _ []byte) string { return okResponse(req.URL.Path) }))
	p := newPool(t, u.addr, h1client.Config{})
	for _, path := range []string{"/a", "/b", "/c"} {
		res, body, err := get(t, p, "GET", path)
		if err != nil || res.StatusCode != 200 || body != path {
			t.Fatalf("GET %s: %v %q %v", path, res, body, err)
		}
		if p.Idle() != 1 {
			t.Fatalf("after GET %s: %d idle connections, want 1", path, p.Idle())
		}
	}
	if n := u.connCount(); n != 1 {
		t.Fatalf("%d upstream connections, want 1", n)
	}
}

// TestConnectionClose: a response with Connection: close, an HTTP/1.0
// response and a close-delimited one end their connection; a pool that
// keeps none says Connection: close itself.
func TestConnectionClose(t *testing.T) {
	for _, tc := range []struct {
		name, resp string
		maxIdle    int
		wantClose  bool // the request says Connection: close
	}{
		{"upstream says close", "HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok", 4, false},
		{"HTTP/1.0", "HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok", 4, false},
		{"close-delimited", "HTTP/1.1 200 OK\r\n\r\nok", 4, false},
		{"pool keeps none", okResponse("ok"), -1, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			u := newUpstream()
			var mu sync.Mutex
			var conns []string
			u.start(t, func(i int, c net.Conn, br *bufio.Reader) {
				req, err := http.ReadRequest(br)
				if err != nil {
					return
				}
				mu.Lock()
				conns = append(conns, req.Header.Get("Connection"))
				mu.Unlock()
				_, _ = io.WriteString(c, tc.resp)
				if !strings.Contains(tc.resp, "Content-Length") {
					return // close-delimited: the close ends the body
				}
				if _, err := http.ReadRequest(br); err == io.EOF {
					u.closed <- i
				}
			})
			p := newPool(t, u.addr, h1client.Config{MaxIdle: tc.maxIdle})
			for range 2 {
				if res, body, err := get(t, p, "GET", "/"); err != nil || body != "ok" || !res.Close {
					t.Fatalf("GET: %v %q %v (Close should be set)", res, body, err)
				}
			}
			if n := u.connCount(); n != 2 {
				t.Fatalf("%d upstream connections, want 2 (one per request)", n)
			}
			if strings.Contains(tc.resp, "Content-Length") {
				u.waitClosed(t, 0)
			}
			mu.Lock()
			defer mu.Unlock()
			for _, v := range conns {
				if (v == "close") != tc.wantClose {
					t.Errorf("request Connection field %q, want close: %v", v, tc.wantClose)
				}
			}
		})
	}
}

// TestChunkedTrailers: a chunked body arrives whole, its trailers in
// Response.Trailer after EOF, and the connection is pooled.
func TestChunkedTrailers(t *testing.T) {
	u := newUpstream()
	u.start(t, u.serveEach(func(int, *http.Request, []byte) string {
		return "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nTrailer: X-Sum\r\n\r\n" +
			"5\r\nhello\r\n1;ext=1\r\n \r\n5\r\nworld\r\n0\r\nX-Sum: 42\r\nX-Other: a\r\n\r\n"
	}))
	p := newPool(t, u.addr, h1client.Config{})
	for range 2 {
		res, body, err := get(t, p, "GET", "/")
		if err != nil || body != "hello world" {
			t.Fatalf("body %q, %v", body, err)
		}
		if res.ContentLength != -1 || len(res.TransferEncoding) != 1 || res.Header.Get("Transfer-Encoding") != "" {
			t.Errorf("ContentLength %d, TransferEncoding %v, header %v", res.ContentLength, res.TransferEncoding, res.Header)
		}
		if res.Trailer.Get("X-Sum") != "42" || res.Trailer.Get("X-Other") != "a" {
			t.Errorf("trailers %v", res.Trailer)
		}
	}
	if n := u.connCount(); n != 1 {
		t.Fatalf("%d upstream connections, want 1", n)
	}
}

// TestSlowUpstreamHead: an upstream that never answers, and one that
// writes its head a byte at a time, are both cut at HeadTimeout, which
// reads of a partial head do not renew; the error is a timeout.
func TestSlowUpstreamHead(t *testing.T) {
	head := "HTTP/1.1 200 OK\r\nX-Pad: " + strings.Repeat("a", 4000) + "\r\nContent-Length: 2\r\n\r\nok"
	for _, tc := range []struct {
		name  string
		write func(c net.Conn, stop <-chan struct{})
	}{
		{"silent", func(net.Conn, <-chan struct{}) {}},
		{"dribbling", func(c net.Conn, stop <-chan struct{}) {
			tick := time.NewTicker(5 * time.Millisecond) // the simulated slow upstream: 20 s for the head
			defer tick.Stop()
			for i := range len(head) {
				if _, err := io.WriteString(c, head[i:i+1]); err != nil {
					return
				}
				select {
				case <-tick.C:
				case <-stop:
					return
				}
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			stop := make(chan struct{})
			u := startUpstream(t, func(_ int, c net.Conn, br *bufio.Reader) {
				if _, err := http.ReadRequest(br); err != nil {
					return
				}
				tc.write(c, stop)
				_, _ = io.Copy(io.Discard, c) // until the client closes
			})
			defer close(stop)
			p := newPool(t, u.addr, h1client.Config{HeadTimeout: 200 * time.Millisecond})
			_, _, err := get(t, p, "GET", "/")
			var te interface{ Timeout() bool }
			if !errors.As(err, &te) || !te.Timeout() {
				t.Fatalf("error %v, want a timeout", err)
			}
			if p.Idle() != 0 {
				t.Fatal("the timed-out connection was pooled")
			}
		})
	}
}

// TestUpstreamSendsTooMuch: bytes after a response, in the same read or
// queued later, never reach another request: the connection is closed
// at release, or found unclean when taken from the pool.
func TestUpstreamSendsTooMuch(t *testing.T) {
	const extra = "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nforged"
	t.Run("with the response", func(t *testing.T) {
		u := newUpstream()
		u.start(t, u.serveEach(func(i int, req *http.Request, _ []byte) string {
			if i == 0 {
				return okResponse("first") + extra
			}
			return okResponse("second")
		}))
		p := newPool(t, u.addr, h1client.Config{})
		if _, body, err := get(t, p, "GET", "/"); err != nil || body != "first" {
			t.Fatalf("%q %v", body, err)
		}
		if p.Idle() != 0 {
			t.Fatal("a connection with bytes past its response was pooled")
		}
		u.waitClosed(t, 0)
		if _, body, err := get(t, p, "GET", "/"); err != nil || body != "second" {
			t.Fatalf("next request: %q %v", body, err)
		}
	})
	t.Run("after the response", func(t *testing.T) {
		sent := make(chan struct{})
		u := startUpstream(t, func(i int, c net.Conn, br *bufio.Reader) {
			for {
				if _, err := http.ReadRequest(br); err != nil {
					return
				}
				if i > 0 {
					_, _ = io.WriteString(c, okResponse("second"))
					continue
				}
				_, _ = io.WriteString(c, okResponse("first"))
				<-sent
				_, _ = io.WriteString(c, extra)
			}
		})
		var mu sync.Mutex
		var first *net.TCPConn
		p := newPool(t, u.addr, h1client.Config{Dial: func(ctx context.Context, network, addr string) (net.Conn, error) {
			var d net.Dialer
			c, err := d.DialContext(ctx, network, addr)
			mu.Lock()
			if first == nil && err == nil {
				first = c.(*net.TCPConn)
			}
			mu.Unlock()
			return c, err
		}})
		if _, body, err := get(t, p, "GET", "/"); err != nil || body != "first" {
			t.Fatalf("%q %v", body, err)
		}
		if p.Idle() != 1 {
			t.Fatal("a clean connection was not pooled")
		}
		close(sent)
		mu.Lock()
		c := first
		mu.Unlock()
		testkit.WaitFor(t, "the extra bytes queued on the pooled connection", func() bool { return inq(t, c) > 0 })
		if _, body, err := get(t, p, "GET", "/"); err != nil || body != "second" {
			t.Fatalf("next request: %q %v (the pooled connection's extra bytes must not answer it)", body, err)
		}
		if n := u.connCount(); n != 2 {
			t.Fatalf("%d upstream connections, want 2", n)
		}
	})
}

// inq is the number of bytes queued to read on c.
func inq(t *testing.T, c *net.TCPConn) int {
	rc, err := c.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	n := -1
	_ = rc.Control(func(fd uintptr) { n, _ = unix.IoctlGetInt(int(fd), unix.SIOCINQ) })
	return n
}

// tcpState is c's TCP state (unix.BPF_TCP_*).
func tcpState(t *testing.T, c *net.TCPConn) int {
	rc, err := c.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	state := -1
	_ = rc.Control(func(fd uintptr) {
		if info, err := unix.GetsockoptTCPInfo(int(fd), unix.IPPROTO_TCP, unix.TCP_INFO); err == nil {
			state = int(info.State)
		}
	})
	return state
}

// TestStalePooledConnection: a pooled connection the upstream closed is
// not used: the close is seen before the request goes out, and a new
// connection serves it; a request that fails on a reused connection
// before any response byte is replayed once when it is body-less and
// safe, and fails otherwise.
func TestStalePooledConnection(t *testing.T) {
	u := newUpstream()
	u.start(t, func(i int, c net.Conn, br *bufio.Reader) {
		req, err := http.ReadRequest(br)
		if err != nil {
			return
		}
		_, _ = io.Copy(io.Discard, req.Body)
		_, _ = io.WriteString(c, okResponse("ok"))
		// then close, without saying so
	})
	t.Run("seen before reuse", func(t *testing.T) {
		var mu sync.Mutex
		var first *net.TCPConn
		p := newPool(t, u.addr, h1client.Config{Dial: func(ctx context.Context, network, addr string) (net.Conn, error) {
			var d net.Dialer
			c, err := d.DialContext(ctx, network, addr)
			mu.Lock()
			if first == nil && err == nil {
				first = c.(*net.TCPConn)
			}
			mu.Unlock()
			return c, err
		}})
		if _, body, err := get(t, p, "GET", "/"); err != nil || body != "ok" {
			t.Fatalf("%q %v", body, err)
		}
		mu.Lock()
		c := first
		mu.Unlock()
		testkit.WaitFor(t, "the upstream's FIN on the pooled connection", func() bool { return tcpState(t, c) == unix.BPF_TCP_CLOSE_WAIT })
		if _, body, err := get(t, p, "POST", "/"); err != nil || body != "ok" {
			t.Fatalf("POST after the upstream closed the pooled connection: %q %v", body, err)
		}
	})
	t.Run("failed on reuse", func(t *testing.T) {
		// A dialer whose connections cannot be peeked at: the pool
		// trusts them, so the reuse itself fails.
		p := newPool(t, u.addr, h1client.Config{Dial: func(ctx context.Context, network, addr string) (net.Conn, error) {
			var d net.Dialer
			c, err := d.DialContext(ctx, network, addr)
			return struct{ net.Conn }{c}, err
		}})
		if _, body, err := get(t, p, "GET", "/"); err != nil || body != "ok" {
			t.Fatalf("%q %v", body, err)
		}
		if _, body, err := get(t, p, "GET", "/"); err != nil || body != "ok" {
			t.Fatalf("GET on a dead pooled connection, replayed: %q %v", body, err)
		}
		if _, _, err := get(t, p, "DELETE", "/"); err == nil {
			t.Fatal("DELETE on a dead pooled connection succeeded: it must not be replayed")
		}
	})
}

// TestVanishingUpstreamMidBody: an upstream that goes away mid-body
// fails the body read (never a clean EOF) and the connection is gone.
func TestVanishingUpstreamMidBody(t *testing.T) {
	for _, tc := range []struct{ name, resp string }{
		{"content-length", "HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\npartial"},
		{"chunked", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n64\r\npartial"},
		{"chunked between chunks", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n7\r\npartial\r\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			u := startUpstream(t, func(_ int, c net.Conn, br *bufio.Reader) {
				if _, err := http.ReadRequest(br); err != nil {
					return
				}
				_, _ = io.WriteString(c, tc.resp)
			})
			p := newPool(t, u.addr, h1client.Config{})
			_, body, err := get(t, p, "GET", "/")
			if !errors.Is(err, io.ErrUnexpectedEOF) && !errors.Is(err, syscall.ECONNRESET) {
				t.Fatalf("body %q, error %v; want an unexpected EOF", body, err)
			}
			if p.Idle() != 0 {
				t.Fatal("pooled")
			}
		})
	}
}

// TestContextCancelMidBody: cancelling the request's context unblocks a
// body read waiting on a silent upstream, which returns the context's
// error, and closes the connection.
func TestContextCancelMidBody(t *testing.T) {
	u := newUpstream()
	u.start(t, func(i int, c net.Conn, br *bufio.Reader) {
		if _, err := http.ReadRequest(br); err != nil {
			return
		}
		_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nfirst")
		if _, err := io.Copy(io.Discard, c); err == nil {
			u.closed <- i // the client closed it
		}
	})
	p := newPool(t, u.addr, h1client.Config{})
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, "GET", "http://x/", nil)
	res, err := p.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	buf := make([]byte, 5)
	if _, err := io.ReadFull(res.Body, buf); err != nil {
		t.Fatal(err)
	}
	read := make(chan error, 1)
	go func() { _, err := res.Body.Read(buf); read <- err }()
	cancel()
	if err := <-read; !errors.Is(err, context.Canceled) {
		t.Fatalf("read after cancel: %v, want context.Canceled", err)
	}
	u.waitClosed(t, 0)
	if p.Idle() != 0 {
		t.Fatal("pooled")
	}
}

// TestBodyIdle: a body read that gets nothing for BodyIdle fails with a
// timeout.
func TestBodyIdle(t *testing.T) {
	u := startUpstream(t, func(_ int, c net.Conn, br *bufio.Reader) {
		if _, err := http.ReadRequest(br); err != nil {
			return
		}
		_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nfirst")
		_, _ = io.Copy(io.Discard, c)
	})
	p := newPool(t, u.addr, h1client.Config{BodyIdle: 100 * time.Millisecond})
	_, body, err := get(t, p, "GET", "/")
	var te interface{ Timeout() bool }
	if body != "first" || !errors.As(err, &te) || !te.Timeout() {
		t.Fatalf("body %q, error %v; want the first bytes, then a timeout", body, err)
	}
}

// TestCloseBeforeEOF: a body closed before its end closes the
// connection; the next request gets a new one.
func TestCloseBeforeEOF(t *testing.T) {
	u := newUpstream()
	u.start(t, u.serveEach(func(int, *http.Request, []byte) string { return okResponse(strings.Repeat("x", 100000)) }))
	p := newPool(t, u.addr, h1client.Config{})
	req, _ := http.NewRequest("GET", "http://x/", nil)
	res, err := p.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	_ = res.Body.Close()
	if _, err := res.Body.Read(make([]byte, 1)); err == nil {
		t.Fatal("read after Close succeeded")
	}
	u.waitClosed(t, 0)
	if _, body, err := get(t, p, "GET", "/"); err != nil || len(body) != 100000 {
		t.Fatalf("next request: %d bytes, %v", len(body), err)
	}
}

// TestRequestBodies: a known-length body goes with Content-Length, an
// unknown one chunked with its trailers; a body shorter or longer than
// its Content-Length fails the request and closes the connection.
func TestRequestBodies(t *testing.T) {
	u := newUpstream()
	u.start(t, u.serveEach(func(_ int, req *http.Request, body []byte) string {
		return okResponse(strings.Join([]string{string(body), req.Header.Get("Content-Length"),
			strings.Join(req.TransferEncoding, ","), req.Trailer.Get("X-T"), req.Header.Get("X-A")}, "|"))
	}))
	p := newPool(t, u.addr, h1client.Config{})
	send := func(length int64, body io.Reader, trailer http.Header) (string, error) {
		req, _ := http.NewRequest("POST", "http://x/", io.NopCloser(body))
		req.ContentLength = length
		req.Header.Set("X-A", "a")
		req.Trailer = trailer
		res, err := p.RoundTrip(req)
		if err != nil {
			return "", err
		}
		defer res.Body.Close()
		b, err := io.ReadAll(res.Body)
		return string(b), err
	}
	big := strings.Repeat("b", 100000)
	if got, err := send(int64(len(big)), strings.NewReader(big), nil); err != nil || got != big+"|100000|||a" {
		t.Fatalf("known length: %.40q %v", got, err)
	}
	tr := http.Header{"X-T": nil}
	pr, pw := io.Pipe()
	go func() {
		_, _ = io.WriteString(pw, "stream")
		_, _ = io.WriteString(pw, "ing")
		tr.Set("X-T", "sum")
		_ = pw.Close()
	}()
	if got, err := send(-1, pr, tr); err != nil || got != "streaming||chunked|sum|a" {
		t.Fatalf("chunked: %q %v", got, err)
	}
	if n := u.connCount(); n != 1 {
		t.Fatalf("%d upstream connections, want 1", n)
	}
	if _, err := send(10, strings.NewReader("short"), nil); err == nil {
		t.Fatal("a body shorter than its Content-Length was sent")
	}
	if _, err := send(2, strings.NewReader("long"), nil); err == nil {
		t.Fatal("a body longer than its Content-Length was sent")
	}
	u.waitClosed(t, 0)
}

// TestInterimResponses: interim responses are skipped up to the bound
// httpparse sets; one more fails the exchange; a 101 (the client asks
// for no upgrade) is refused.
func TestInterimResponses(t *testing.T) {
	hint := "HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n"
	for _, tc := range []struct {
		name, resp string
		want       error
	}{
		{"within the bound", strings.Repeat(hint, httpparse.MaxInterims) + okResponse("ok"), nil},
		{"one too many", strings.Repeat(hint, httpparse.MaxInterims+1) + okResponse("ok"), httpparse.ErrTooManyInterims},
		{"101", "HTTP/1.1 101 Switching Protocols\r\nUpgrade: x\r\nConnection: upgrade\r\n\r\n", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			u := newUpstream()
			u.start(t, u.serveEach(func(int, *http.Request, []byte) string { return tc.resp }))
			p := newPool(t, u.addr, h1client.Config{})
			_, body, err := get(t, p, "GET", "/")
			switch {
			case tc.name == "101":
				if err == nil || !strings.Contains(err.Error(), "101") {
					t.Fatalf("101: %q %v, want refused", body, err)
				}
			case tc.want == nil && (err != nil || body != "ok"):
				t.Fatalf("%q %v", body, err)
			case tc.want != nil && !errors.Is(err, tc.want):
				t.Fatalf("%q %v, want %v", body, err, tc.want)
			}
		})
	}
}

// TestHeadAndNoBody: a HEAD response's Content-Length is its length, no
// body follows and the connection is reused; so for 204 and 304.
func TestHeadAndNoBody(t *testing.T) {
	u := newUpstream()
	u.start(t, u.serveEach(func(_ int, req *http.Request, _ []byte) string {
		switch req.URL.Path {
		case "/204":
			return "HTTP/1.1 204 No Content\r\n\r\n"
		case "/304":
			return "HTTP/1.1 304 Not Modified\r\nContent-Length: 9\r\n\r\n"
		}
		return "HTTP/1.1 200 OK\r\nContent-Length: 12\r\n\r\n"
	}))
	p := newPool(t, u.addr, h1client.Config{})
	res, body, err := get(t, p, "HEAD", "/")
	if err != nil || body != "" || res.ContentLength != 12 {
		t.Fatalf("HEAD: %v %q %v", res, body, err)
	}
	for _, path := range []string{"/204", "/304"} {
		if res, body, err := get(t, p, "GET", path); err != nil || body != "" || res.ContentLength != 0 {
			t.Fatalf("%s: %v %q %v", path, res, body, err)
		}
	}
	if n := u.connCount(); n != 1 {
		t.Fatalf("%d upstream connections, want 1", n)
	}
}

// TestIdleTimeout: a pooled connection idle for IdleTimeout is closed.
func TestIdleTimeout(t *testing.T) {
	u := newUpstream()
	u.start(t, u.serveEach(func(int, *http.Request, []byte) string { return okResponse("ok") }))
	p := newPool(t, u.addr, h1client.Config{IdleTimeout: 50 * time.Millisecond})
	if _, _, err := get(t, p, "GET", "/"); err != nil {
		t.Fatal(err)
	}
	u.waitClosed(t, 0)
	if p.Idle() != 0 {
		t.Fatal("the closed connection is still pooled")
	}
}

// TestMaxIdle: no more than MaxIdle connections stay pooled.
func TestMaxIdle(t *testing.T) {
	release := make(chan struct{})
	u := startUpstream(t, func(_ int, c net.Conn, br *bufio.Reader) {
		for {
			if _, err := http.ReadRequest(br); err != nil {
				return
			}
			<-release
			_, _ = io.WriteString(c, okResponse("ok"))
		}
	})
	p := newPool(t, u.addr, h1client.Config{MaxIdle: 2})
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req, _ := http.NewRequest("GET", "http://x/", nil)
			if res, err := p.RoundTrip(req); err == nil {
				_, _ = io.Copy(io.Discard, res.Body)
				_ = res.Body.Close()
			}
		}()
	}
	testkit.WaitFor(t, "four upstream connections", func() bool { return u.connCount() == 4 })
	close(release)
	wg.Wait()
	if n := p.Idle(); n != 2 {
		t.Fatalf("%d idle, want 2", n)
	}
}

// TestInvalidRequestRefused: a request that cannot go on the wire as it
// is fails before anything is sent.
func TestInvalidRequestRefused(t *testing.T) {
	u := startUpstream(t, func(_ int, c net.Conn, br *bufio.Reader) {
		if _, err := http.ReadRequest(br); err == nil {
			t.Error("the upstream got a request")
		}
	})
	p := newPool(t, u.addr, h1client.Config{})
	for _, mod := range []func(r *http.Request){
		func(r *http.Request) { r.Header["X-A"] = []string{"a\r\nX-Injected: 1"} },
		func(r *http.Request) { r.Header["X A"] = []string{"a"} },
		func(r *http.Request) { r.Host = "a b" },
		func(r *http.Request) { r.Method = "GE T" },
		func(r *http.Request) { r.URL.RawQuery = "a b" },
	} {
		req, _ := http.NewRequest("GET", "http://x/", nil)
		mod(req)
		if _, err := p.RoundTrip(req); err == nil {
			t.Errorf("request %v %q %v sent", req.Method, req.Host, req.Header)
		}
	}
}

// TestRequestHead: the exact bytes of request heads: origin-form target
// with its escaping and query, or "*"; Host from the request; fields in
// name order; the client's own framing and Connection fields never
// passed on, its framing written from ContentLength.
func TestRequestHead(t *testing.T) {
	heads := make(chan string, 4)
	u := startUpstream(t, func(_ int, c net.Conn, br *bufio.Reader) {
		for {
			var head strings.Builder
			for {
				line, err := br.ReadString('\n')
				if err != nil {
					return
				}
				head.WriteString(line)
				if line == "\r\n" {
					break
				}
			}
			heads <- head.String()
			if _, err := io.WriteString(c, okResponse("ok")); err != nil {
				return
			}
		}
	})
	p := newPool(t, u.addr, h1client.Config{})
	for _, tc := range []struct {
		method, url, host string
		header            http.Header
		want              string
	}{
		{"GET", "http://x/a%2Fb/c?q=1&r", "svc.example", http.Header{"X-B": {"2"}, "X-A": {"1", "1b"}, "Content-Length": {"99"},
			"Transfer-Encoding": {"chunked"}, "Connection": {"x"}, "Host": {"other"}},
			"GET /a%2Fb/c?q=1&r HTTP/1.1\r\nHost: svc.example\r\nX-A: 1\r\nX-A: 1b\r\nX-B: 2\r\n\r\n"},
		{"OPTIONS", "*", "svc.example", nil, "OPTIONS * HTTP/1.1\r\nHost: svc.example\r\n\r\n"},
		{"POST", "http://x", "", nil, "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n"},
	} {
		req, err := http.NewRequest(tc.method, tc.url, nil)
		if err != nil {
			t.Fatal(err)
		}
		if tc.url == "*" {
			req.URL = &url.URL{Opaque: "*"}
		}
		req.Host = tc.host
		req.Header = tc.header
		res, err := p.RoundTrip(req)
		if err != nil {
			t.Fatalf("%s %s: %v", tc.method, tc.url, err)
		}
		_, _ = io.Copy(io.Discard, res.Body)
		_ = res.Body.Close()
		if got := <-heads; got != tc.want {
			t.Errorf("%s %s: head\n%q, want\n%q", tc.method, tc.url, got, tc.want)
		}
	}
}
