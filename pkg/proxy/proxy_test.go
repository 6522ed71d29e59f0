package proxy

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/rl-tproxy/rl-tproxy/internal/testkit"
	"github.com/rl-tproxy/rl-tproxy/pkg/httpparse"
)

func TestListenIsPlainTCP(t *testing.T) {
	ln, err := Listen(context.Background(), "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	raw, err := ln.(*net.TCPListener).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var proto int
	var serr error
	if err := raw.Control(func(fd uintptr) {
		proto, serr = unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_PROTOCOL)
	}); err != nil {
		t.Fatal(err)
	}
	if serr != nil {
		t.Fatal(serr)
	}
	if proto != unix.IPPROTO_TCP {
		t.Fatalf("SO_PROTOCOL = %d, want IPPROTO_TCP (%d): MPTCP listeners cannot enter a sockmap", proto, unix.IPPROTO_TCP)
	}
}

// echoHandler answers with the request's method, path, selected headers
// and body.
func echoHandler(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	w.Header().Set("X-Method", r.Method)
	w.Header().Set("X-TE", strings.Join(r.TransferEncoding, ","))
	w.Header().Set("X-CL", strconv.FormatInt(r.ContentLength, 10))
	fmt.Fprintf(w, "%s %s body=%s", r.Method, r.URL.RequestURI(), body)
}

func TestStrictnessRulesAnswered(t *testing.T) {
	up := newRawUpstream(t, func(int, net.Conn) {})
	hook := newTestHook(nil)
	rules := make(chan string, 1)
	_, addr := startProxy(t, hook, &Service{Upstream: up.addr(), HeaderTimeout: 5 * time.Second}, func(cfg *Config) {
		cfg.OnReject = func(_ *Service, _ netip.AddrPort, rule string, _ int) { rules <- rule }
	})
	long := strings.Repeat("a", 9000)
	cases := []struct {
		name, req string
		rule      *httpparse.Error
	}{
		{"te-with-cl", "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n", httpparse.ErrTEWithCL},
		{"te-not-chunked", "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n\r\n", httpparse.ErrTEUnsupported},
		{"cl-sign", "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: +3\r\n\r\nabc", httpparse.ErrBadContentLength},
		{"cl-differs", "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\nabc", httpparse.ErrConflictingLength},
		{"obs-fold", "GET / HTTP/1.1\r\nHost: x\r\nX-A: a\r\n b\r\n\r\n", httpparse.ErrObsFold},
		{"space-before-colon", "GET / HTTP/1.1\r\nHost : x\r\n\r\n", httpparse.ErrSpaceBeforeColon},
		{"missing-host", "GET / HTTP/1.1\r\nX: y\r\n\r\n", httpparse.ErrMissingHost},
		{"repeated-host", "GET / HTTP/1.1\r\nHost: x\r\nHost: y\r\n\r\n", httpparse.ErrRepeatedHost},
		{"bare-lf", "GET / HTTP/1.1\nHost: x\r\n\r\n", httpparse.ErrBareLF},
		{"nul", "GET / HTTP/1.1\r\nHost: x\r\nX: a\x00b\r\n\r\n", httpparse.ErrNUL},
		{"te-http10", "POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n", httpparse.ErrTEHTTP10},
		{"version", "GET / HTTP/2.0\r\nHost: x\r\n\r\n", httpparse.ErrVersionUnsupported},
		{"request-line-too-long", "GET /" + long + " HTTP/1.1\r\nHost: x\r\n\r\n", httpparse.ErrRequestLineTooLong},
		{"header-block-too-big", "GET / HTTP/1.1\r\nHost: x\r\nX: " + strings.Repeat("b", 17000) + "\r\n\r\n", httpparse.ErrHeaderTooBig},
		{"bad-chunk-size", "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nabc\r\n0\r\n\r\n", httpparse.ErrBadChunkSize},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := dialClient(t, addr)
			c.send(tc.req)
			r, _ := c.resp("GET")
			if r.StatusCode != tc.rule.Status {
				t.Fatalf("status %d, want %d", r.StatusCode, tc.rule.Status)
			}
			if rule := <-rules; rule != tc.rule.Rule {
				t.Fatalf("rule %q, want %q", rule, tc.rule.Rule)
			}
			if !r.Close {
				t.Fatalf("answer to a malformed request must close the connection")
			}
			c.expectClosed()
		})
	}
	// Only the chunk-size case reaches admission (its head is fine); no
	// malformed head ever reaches the upstream.
	if got := hook.admitted(); len(got) != 1 {
		t.Fatalf("admissions: %v", got)
	}
}

func TestPipelinedInOrder(t *testing.T) {
	up := httpUpstream(t, http.HandlerFunc(echoHandler))
	hook := newTestHook(nil)
	_, addr := startProxy(t, hook, &Service{Upstream: up}, nil)
	c := dialClient(t, addr)
	c.send("GET /1 HTTP/1.1\r\nHost: x\r\n\r\n" +
		"POST /2 HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello" +
		"POST /3 HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n" +
		"HEAD /4 HTTP/1.1\r\nHost: x\r\n\r\n" +
		"GET /5 HTTP/1.1\r\nHost: x\r\n\r\n")
	want := []struct{ method, body string }{
		{"GET", "GET /1 body="}, {"POST", "POST /2 body=hello"}, {"POST", "POST /3 body=abc"},
		{"HEAD", ""}, {"GET", "GET /5 body="},
	}
	for i, w := range want {
		r, body := c.resp(w.method)
		if r.StatusCode != 200 || body != w.body || r.Header.Get("X-Method") != w.method {
			t.Fatalf("response %d: %d %q (method %s)", i, r.StatusCode, body, r.Header.Get("X-Method"))
		}
	}
	for range want {
		hook.waitDone(t)
	}
}

func TestChunkedBothWays(t *testing.T) {
	up := httpUpstream(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		w.Header().Set("X-TE", strings.Join(r.TransferEncoding, ","))
		w.Header().Set("X-Trailer-Seen", r.Trailer.Get("X-T"))
		// Flushing before the end forces a chunked response.
		w.Write([]byte("got:"))
		w.(http.Flusher).Flush()
		w.Write(body)
	}))
	_, addr := startProxy(t, nil, &Service{Upstream: up}, nil)

	t.Run("http11", func(t *testing.T) {
		c := dialClient(t, addr)
		// The body arrives in pieces, with an extension and a trailer.
		c.send("POST /c HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5;ext=1\r\nhel")
		c.send("lo\r\n")
		c.send("6\r\n world\r\n0\r\nX-T: v\r\n\r\n")
		r, body := c.resp("POST")
		if body != "got:hello world" {
			t.Fatalf("body %q", body)
		}
		if r.Header.Get("X-TE") != "chunked" {
			t.Fatalf("upstream framing %q, want chunked", r.Header.Get("X-TE"))
		}
		if len(r.TransferEncoding) != 1 || r.TransferEncoding[0] != "chunked" {
			t.Fatalf("client framing %v, want chunked", r.TransferEncoding)
		}
		// Trailers are not forwarded (documented).
		if r.Header.Get("X-Trailer-Seen") != "" {
			t.Fatalf("trailer forwarded")
		}
		// Connection still usable.
		c.send("POST /c HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\nok")
		if _, body := c.resp("POST"); body != "got:ok" {
			t.Fatalf("second body %q", body)
		}
	})
	t.Run("http10-client", func(t *testing.T) {
		c := dialClient(t, addr)
		c.send("POST /c HTTP/1.0\r\nContent-Length: 3\r\n\r\nabc")
		r, body := c.resp("POST")
		if body != "got:abc" || len(r.TransferEncoding) != 0 || !r.Close {
			t.Fatalf("HTTP/1.0 client: body %q te %v close %v", body, r.TransferEncoding, r.Close)
		}
		c.expectClosed()
	})
}

func TestExpect100(t *testing.T) {
	up := httpUpstream(t, http.HandlerFunc(echoHandler))
	admitted := make(chan struct{}, 1)
	release := make(chan bool)
	hook := newTestHook(func(ctx context.Context, r *Request) Decision {
		admitted <- struct{}{}
		if <-release {
			return Decision{Allow: true}
		}
		return Decision{Status: 429, Header: []httpparse.Header{{Name: []byte("Retry-After"), Value: []byte("1")}}}
	})
	_, addr := startProxy(t, hook, &Service{Upstream: up}, nil)
	head := "POST /e HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 4\r\n\r\n"

	t.Run("allow", func(t *testing.T) {
		c := dialClient(t, addr)
		c.send(head)
		<-admitted
		// Nothing may have been sent while admission is pending: loopback
		// delivers synchronously, so a premature 100 would be queued now.
		assertNothingQueued(t, c.c)
		release <- true
		line, err := c.br.ReadString('\n')
		if err != nil || line != "HTTP/1.1 100 Continue\r\n" {
			t.Fatalf("want 100 Continue, got %q %v", line, err)
		}
		if l, _ := c.br.ReadString('\n'); l != "\r\n" {
			t.Fatalf("100 not terminated: %q", l)
		}
		c.send("data")
		r, body := c.resp("POST")
		if r.StatusCode != 200 || body != "POST /e body=data" {
			t.Fatalf("%d %q", r.StatusCode, body)
		}
		hook.waitDone(t)
	})
	t.Run("deny", func(t *testing.T) {
		c := dialClient(t, addr)
		c.send(head)
		<-admitted
		release <- false
		r, _ := c.resp("POST")
		if r.StatusCode != 429 || r.Header.Get("Retry-After") != "1" {
			t.Fatalf("got %d %v", r.StatusCode, r.Header)
		}
		if !r.Close {
			t.Fatal("deny with an unread body must close")
		}
		d := hook.waitDone(t)
		if d.allow || d.status != 429 {
			t.Fatalf("done %+v", d)
		}
	})
}

// assertNothingQueued fails if the proxy already sent bytes on c.
func assertNothingQueued(t *testing.T, c net.Conn) {
	t.Helper()
	raw, err := c.(*net.TCPConn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var n int
	raw.Control(func(fd uintptr) {
		n, _ = unix.IoctlGetInt(int(fd), unix.SIOCINQ)
	})
	if n != 0 {
		t.Fatalf("%d bytes sent to the client before admission allowed", n)
	}
}

func TestBodylessResponses(t *testing.T) {
	// HEAD, 204 and 304 carry no body even with a Content-Length; the
	// connection must stay in sync for the next request.
	up := newRawUpstream(t, func(_ int, c net.Conn) {
		br := bufio.NewReader(c)
		for {
			head, err := readRequestHead(br)
			if err != nil {
				return
			}
			switch {
			case strings.HasPrefix(head, "HEAD"):
				io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 1234\r\n\r\n")
			case strings.Contains(head, "/204"):
				io.WriteString(c, "HTTP/1.1 204 No Content\r\n\r\n")
			case strings.Contains(head, "/304"):
				io.WriteString(c, "HTTP/1.1 304 Not Modified\r\nContent-Length: 99\r\nETag: \"x\"\r\n\r\n")
			default:
				io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
			}
		}
	})
	_, addr := startProxy(t, nil, &Service{Upstream: up.addr()}, nil)
	c := dialClient(t, addr)
	for _, tc := range []struct{ method, path, cl string }{
		{"HEAD", "/", "1234"}, {"GET", "/204", ""}, {"GET", "/304", "99"}, {"GET", "/", "2"},
	} {
		c.send(tc.method + " " + tc.path + " HTTP/1.1\r\nHost: x\r\n\r\n")
		r, body := c.resp(tc.method)
		if tc.path == "/" && tc.method == "GET" {
			if body != "ok" {
				t.Fatalf("body %q", body)
			}
			continue
		}
		if body != "" || r.Header.Get("Content-Length") != tc.cl {
			t.Fatalf("%s %s: body %q cl %q", tc.method, tc.path, body, r.Header.Get("Content-Length"))
		}
	}
	if up.count() != 1 {
		t.Fatalf("upstream connections %d, want 1 (reused)", up.count())
	}
}

func TestInterimResponsesRelayed(t *testing.T) {
	up := newRawUpstream(t, func(_ int, c net.Conn) {
		br := bufio.NewReader(c)
		if _, err := readRequestHead(br); err != nil {
			return
		}
		io.WriteString(c, "HTTP/1.1 103 Early Hints\r\nLink: </s.css>; rel=preload\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
	})
	_, addr := startProxy(t, nil, &Service{Upstream: up.addr()}, nil)
	c := dialClient(t, addr)
	c.send("GET / HTTP/1.1\r\nHost: x\r\n\r\n")
	line, _ := c.br.ReadString('\n')
	if line != "HTTP/1.1 103 Early Hints\r\n" {
		t.Fatalf("interim: %q", line)
	}
	readRequestHead(c.br) // rest of the 103 head
	if r, body := c.resp("GET"); r.StatusCode != 200 || body != "ok" {
		t.Fatalf("%d %q", r.StatusCode, body)
	}
}

func TestUpstreamCloseMidBody(t *testing.T) {
	up := newRawUpstream(t, func(_ int, c net.Conn) {
		br := bufio.NewReader(c)
		if _, err := readRequestHead(br); err != nil {
			return
		}
		io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n0123456789")
	})
	hook := newTestHook(nil)
	_, addr := startProxy(t, hook, &Service{Upstream: up.addr()}, nil)
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
		p, addr := startProxy(t, hook, &Service{Upstream: up.addr()}, nil)
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
		hook := newTestHook(func(ctx context.Context, r *Request) Decision {
			close(entered)
			select {
			case <-ctx.Done():
				sawCancel.Store(true)
			case <-time.After(20 * time.Second):
			}
			return Decision{Allow: true}
		})
		up := newRawUpstream(t, func(int, net.Conn) {})
		_, addr := startProxy(t, hook, &Service{Upstream: up.addr()}, nil)
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

func TestNoGoroutineLeak(t *testing.T) {
	base := numGoroutines()
	func() {
		up := newRawUpstream(t, func(_ int, c net.Conn) {
			br := bufio.NewReader(c)
			readRequestHead(br)
			io.Copy(io.Discard, br)
		})
		hook := newTestHook(func(ctx context.Context, r *Request) Decision { return Decision{Allow: true} })
		p, err := New(Config{Services: []*Service{{Name: "w", Upstream: up.addr()}}, Hook: hook})
		if err != nil {
			t.Fatal(err)
		}
		ln, _ := Listen(context.Background(), "127.0.0.1:0")
		served := make(chan error, 1)
		go func() { served <- p.Serve(ln, p.Config().Services[0]) }()
		for i := 0; i < 5; i++ {
			c, err := net.Dial("tcp", ln.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			io.WriteString(c, "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\nabc")
			hookWaitAdmit(t, hook, i+1)
			c.Close()
			hook.waitDone(t)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := p.Shutdown(ctx); err != nil {
			t.Fatal(err)
		}
		<-served
		up.ln.Close()
		up.wg.Wait()
	}()
	noLeak(t, base)
}

func numGoroutines() int {
	for i := 0; i < 1000; i++ {
		// let goroutines of earlier tests finish exiting
		runtime.Gosched()
	}
	return runtime.NumGoroutine()
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

func TestUpgradeRelay(t *testing.T) {
	up := newRawUpstream(t, func(_ int, c net.Conn) {
		br := bufio.NewReader(c)
		head, err := readRequestHead(br)
		if err != nil {
			return
		}
		if !strings.Contains(head, "Upgrade: websocket\r\n") || !strings.Contains(head, "Connection: upgrade\r\n") {
			io.WriteString(c, "HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")
			return
		}
		io.WriteString(c, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n")
		// Echo upper-cased until the client closes.
		buf := make([]byte, 100)
		for {
			n, err := br.Read(buf)
			if n > 0 {
				c.Write([]byte(strings.ToUpper(string(buf[:n]))))
			}
			if err != nil {
				return
			}
		}
	})
	hook := newTestHook(nil)
	_, addr := startProxy(t, hook, &Service{Upstream: up.addr()}, nil)
	c := dialClient(t, addr)
	c.send("GET /ws HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n")
	r, err := http.ReadResponse(c.br, nil)
	if err != nil || r.StatusCode != 101 || r.Header.Get("Upgrade") != "websocket" {
		t.Fatalf("%v %v", r, err)
	}
	for _, m := range []string{"hello", "again"} {
		c.send(m)
		buf := make([]byte, len(m))
		if _, err := io.ReadFull(c.br, buf); err != nil || string(buf) != strings.ToUpper(m) {
			t.Fatalf("relay: %q %v", buf, err)
		}
	}
	c.c.(*net.TCPConn).CloseWrite()
	if rest, _ := io.ReadAll(c.br); len(rest) != 0 {
		t.Fatalf("unexpected %q", rest)
	}
	d := hook.waitDone(t)
	if d.status != 101 || d.bytesIn != 10 || d.bytesOut <= 10 { // BytesOut counts the 101 head too
		t.Fatalf("done %+v", d)
	}
	if got := hook.admitted(); len(got) != 1 {
		t.Fatalf("admitted %v: upgrade is admitted once", got)
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
		_, addr := startProxy(t, nil, &Service{Upstream: up.addr()}, nil)
		for i := 0; i < 3; i++ {
			c := dialClient(t, addr)
			c.send("GET / HTTP/1.1\r\nHost: x\r\n\r\n")
			if r, _ := c.resp("GET"); r.StatusCode != 200 {
				t.Fatal(r.Status)
			}
		}
		if up.count() != 1 {
			t.Fatalf("upstream connections: %d, want 1", up.count())
		}
	})
	t.Run("retry-once-idempotent", func(t *testing.T) {
		up := keepAliveUpstream(t, 1)
		hook := newTestHook(nil)
		_, addr := startProxy(t, hook, &Service{Upstream: up.addr()}, nil)
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
		_, addr := startProxy(t, hook, &Service{Upstream: up.addr()}, nil)
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
		ln, _ := net.Listen("tcp", "127.0.0.1:0")
		dead := ln.Addr().String()
		ln.Close()
		_, addr := startProxy(t, nil, &Service{Upstream: dead}, nil)
		c := dialClient(t, addr)
		c.send("GET / HTTP/1.1\r\nHost: x\r\n\r\n")
		if r, _ := c.resp("GET"); r.StatusCode != 502 {
			t.Fatalf("status %d", r.StatusCode)
		}
	})
	t.Run("custom-dial", func(t *testing.T) {
		up := keepAliveUpstream(t, 0)
		var dials atomic.Int32
		_, addr := startProxy(t, nil, &Service{Upstream: "upstream.invalid:80"}, func(cfg *Config) {
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

func TestTimeouts(t *testing.T) {
	up := keepAliveUpstream(t, 0)
	_, addr := startProxy(t, nil, &Service{Upstream: up.addr(), HeaderTimeout: 200 * time.Millisecond,
		IdleTimeout: 200 * time.Millisecond}, nil)
	t.Run("header-408", func(t *testing.T) {
		c := dialClient(t, addr)
		c.send("GET / HTTP/1.1\r\nHost: x\r\n")
		r, _ := c.resp("GET")
		if r.StatusCode != 408 || !r.Close {
			t.Fatalf("status %d close %v", r.StatusCode, r.Close)
		}
	})
	t.Run("idle-close", func(t *testing.T) {
		c := dialClient(t, addr)
		c.send("GET / HTTP/1.1\r\nHost: x\r\n\r\n")
		c.resp("GET")
		c.expectClosed() // no bytes, just a close after the idle timeout
	})
}

func TestForwardedHeaders(t *testing.T) {
	heads := make(chan string, 4)
	up := newRawUpstream(t, func(_ int, c net.Conn) {
		br := bufio.NewReader(c)
		for {
			head, err := readRequestHead(br)
			if err != nil {
				return
			}
			heads <- head
			io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: X-Up, keep-alive\r\nX-Up: secret\r\nKeep-Alive: timeout=5\r\nX-Keep: 1\r\n\r\n")
		}
	})
	svc := &Service{Name: "web", Upstream: up.addr(), XForwardedFor: true, XForwardedProto: true, Forwarded: true, XRealIP: true}
	hook := newTestHook(func(context.Context, *Request) Decision {
		return Decision{Allow: true, Header: []httpparse.Header{{Name: []byte("RateLimit"), Value: []byte(`"p";r=9`)}}}
	})
	for _, host := range []string{"127.0.0.1", "[::1]"} {
		t.Run(host, func(t *testing.T) {
			p, err := New(Config{Services: []*Service{svc}, Hook: hook})
			if err != nil {
				t.Fatal(err)
			}
			ln, err := Listen(context.Background(), host+":0")
			if err != nil {
				testkit.Missing(t, "needs %s loopback: %v", host, err)
			}
			go p.Serve(ln, svc)
			defer p.Shutdown(context.Background())
			c := dialClient(t, ln.Addr().String())
			c.send("GET /f HTTP/1.1\r\nHost: x\r\nConnection: keep-alive, X-Private\r\nX-Private: 1\r\n" +
				"Keep-Alive: 300\r\nProxy-Connection: keep-alive\r\nTE: trailers\r\nTrailer: X\r\nUpgrade: h2c\r\n" +
				"X-Forwarded-For: 203.0.113.9\r\nForwarded: for=203.0.113.9\r\nX-Real-IP: 6.6.6.6\r\nX-Forwarded-Proto: https\r\nX-Keep: yes\r\n\r\n")
			r, _ := c.resp("GET")
			hook.waitDone(t)
			head := <-heads
			ip := strings.Trim(host, "[]")
			for _, gone := range []string{"Connection", "X-Private", "Keep-Alive", "Proxy-Connection", "TE", "Trailer", "Upgrade"} {
				if v := headerOf(head, gone); v != "" {
					t.Errorf("hop-by-hop %s forwarded: %q", gone, v)
				}
			}
			fwdFor := ip
			if strings.Contains(ip, ":") {
				fwdFor = `"[` + ip + `]"`
			}
			for name, want := range map[string]string{
				"X-Forwarded-For":   "203.0.113.9, " + ip,
				"Forwarded":         "for=203.0.113.9, for=" + fwdFor + ";proto=http",
				"X-Real-IP":         ip,
				"X-Forwarded-Proto": "http",
				"X-Keep":            "yes",
				"Host":              "x",
			} {
				if got := headerOf(head, name); got != want {
					t.Errorf("%s = %q, want %q\n%s", name, got, want, head)
				}
			}
			if strings.Count(head, "X-Forwarded-For:") != 1 {
				t.Errorf("X-Forwarded-For not merged:\n%s", head)
			}
			// Response side: hop-by-hop and Connection-named fields dropped,
			// the hook's extra field added.
			if r.Header.Get("X-Up") != "" || r.Header.Get("Keep-Alive") != "" || r.Header.Get("X-Keep") != "1" ||
				r.Header.Get("RateLimit") != `"p";r=9` {
				t.Errorf("response header %v", r.Header)
			}
		})
	}
}

func TestDenyKeepAlive(t *testing.T) {
	up := keepAliveUpstream(t, 0)
	deny := func(ctx context.Context, r *Request) Decision {
		if string(r.Path) == "/deny" {
			return Decision{Status: 429, Header: []httpparse.Header{{Name: []byte("Retry-After"), Value: []byte("2")}},
				Body: []byte("slow down\n"), ContentType: "text/plain"}
		}
		return Decision{Allow: true}
	}
	hook := newTestHook(deny)
	_, addr := startProxy(t, hook, &Service{Upstream: up.addr()}, nil)
	c := dialClient(t, addr)
	c.send("POST /deny HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabcGET /ok HTTP/1.1\r\nHost: x\r\n\r\n")
	r, body := c.resp("POST")
	if r.StatusCode != 429 || body != "slow down\n" || r.Header.Get("Retry-After") != "2" || r.Close {
		t.Fatalf("deny: %d %q %v close=%v", r.StatusCode, body, r.Header, r.Close)
	}
	if r, body := c.resp("GET"); r.StatusCode != 200 || body != "ok" {
		t.Fatalf("after deny: %d %q", r.StatusCode, body)
	}
	// A deny whose body has not arrived closes the connection.
	c.send("POST /deny HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\nab")
	if r, _ := c.resp("POST"); r.StatusCode != 429 || !r.Close {
		t.Fatalf("deny with unread body: %d close=%v", r.StatusCode, r.Close)
	}
	if up.count() != 1 {
		t.Fatalf("upstream conns %d", up.count())
	}
}

func TestMaxRequestsPerConn(t *testing.T) {
	up := keepAliveUpstream(t, 0)
	_, addr := startProxy(t, nil, &Service{Upstream: up.addr(), MaxRequestsPerConn: 2}, nil)
	c := dialClient(t, addr)
	for i := 1; i <= 2; i++ {
		c.send("GET / HTTP/1.1\r\nHost: x\r\n\r\n")
		r, _ := c.resp("GET")
		if r.Close != (i == 2) {
			t.Fatalf("request %d: close=%v", i, r.Close)
		}
	}
	c.expectClosed()
}

func TestMaxBodyBytes(t *testing.T) {
	up := keepAliveUpstream(t, 0)
	_, addr := startProxy(t, nil, &Service{Upstream: up.addr(), MaxBodyBytes: 10}, nil)
	c := dialClient(t, addr)
	c.send("POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 11\r\n\r\n")
	if r, _ := c.resp("POST"); r.StatusCode != 413 {
		t.Fatalf("status %d", r.StatusCode)
	}
}

func TestDrain(t *testing.T) {
	release := make(chan struct{})
	reached := make(chan struct{}, 1)
	up := httpUpstream(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/slow" {
			reached <- struct{}{}
			<-release
		}
		w.Write([]byte("done"))
	}))
	p, err := New(Config{Services: []*Service{{Name: "w", Upstream: up}}})
	if err != nil {
		t.Fatal(err)
	}
	ln, _ := Listen(context.Background(), "127.0.0.1:0")
	served := make(chan error, 1)
	go func() { served <- p.Serve(ln, p.Config().Services[0]) }()
	addr := ln.Addr().String()

	idle := dialClient(t, addr)
	idle.send("GET / HTTP/1.1\r\nHost: x\r\n\r\n")
	idle.resp("GET")
	busy := dialClient(t, addr)
	busy.send("GET /slow HTTP/1.1\r\nHost: x\r\n\r\n")
	<-reached

	shut := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		shut <- p.Shutdown(ctx)
	}()
	idle.expectClosed() // idle keep-alive connections are closed at once
	if err := <-served; err != ErrClosed {
		t.Fatalf("Serve: %v", err)
	}
	if _, err := net.Dial("tcp", addr); err == nil {
		t.Fatal("still accepting after Shutdown")
	}
	close(release)
	r, body := busy.resp("GET")
	if r.StatusCode != 200 || body != "done" || !r.Close {
		t.Fatalf("in-flight: %d %q close=%v", r.StatusCode, body, r.Close)
	}
	if err := <-shut; err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
}

func TestUpdateInFlightKeepsConfig(t *testing.T) {
	upA := newRawUpstream(t, func(_ int, c net.Conn) {
		br := bufio.NewReader(c)
		for {
			if _, err := readRequestHead(br); err != nil {
				return
			}
			io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\nA")
		}
	})
	upB := newRawUpstream(t, func(_ int, c net.Conn) {
		br := bufio.NewReader(c)
		for {
			if _, err := readRequestHead(br); err != nil {
				return
			}
			io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\nB")
		}
	})
	entered := make(chan struct{}, 1)
	release := make(chan struct{})
	hook := newTestHook(func(ctx context.Context, r *Request) Decision {
		if string(r.Path) == "/wait" {
			entered <- struct{}{}
			<-release
		}
		return Decision{Allow: true}
	})
	svcA := &Service{Name: "web", Upstream: upA.addr()}
	p, addr := startProxy(t, hook, svcA, nil)
	c := dialClient(t, addr)
	c.send("GET /wait HTTP/1.1\r\nHost: x\r\n\r\n")
	<-entered
	if err := p.Update(Config{Services: []*Service{{Name: "web", Upstream: upB.addr()}}, Hook: hook}); err != nil {
		t.Fatal(err)
	}
	close(release)
	if _, body := c.resp("GET"); body != "A" {
		t.Fatalf("in-flight request went to %q, want the old upstream A", body)
	}
	c.send("GET / HTTP/1.1\r\nHost: x\r\n\r\n")
	if _, body := c.resp("GET"); body != "B" {
		t.Fatalf("new request went to %q, want B", body)
	}
}

func TestServeSteeredPicksByPort(t *testing.T) {
	up := keepAliveUpstream(t, 0)
	ln, _ := Listen(context.Background(), "127.0.0.1:0")
	port := uint16(ln.Addr().(*net.TCPAddr).Port)
	p, err := New(Config{Services: []*Service{
		{Name: "other", Port: port + 1, Upstream: "127.0.0.1:1"},
		{Name: "this", Port: port, Upstream: up.addr()},
	}})
	if err != nil {
		t.Fatal(err)
	}
	go p.ServeSteered(ln, nil)
	defer p.Shutdown(context.Background())
	c := dialClient(t, ln.Addr().String())
	c.send("GET / HTTP/1.1\r\nHost: x\r\n\r\n")
	if r, _ := c.resp("GET"); r.StatusCode != 200 {
		t.Fatalf("status %d", r.StatusCode)
	}
}

func TestConfigValidation(t *testing.T) {
	for _, cfg := range []Config{
		{Services: []*Service{{Name: "", Upstream: "127.0.0.1:1"}}},
		{Services: []*Service{{Name: "a", Upstream: "nohostport"}}},
		{Services: []*Service{{Name: "a", Upstream: "127.0.0.1:1"}, {Name: "a", Upstream: "127.0.0.1:2"}}},
		{Services: []*Service{{Name: "a", Upstream: "127.0.0.1:1", Listen: []string{"bad"}}}},
	} {
		if _, err := New(cfg); err == nil {
			t.Errorf("accepted %+v", cfg.Services)
		}
	}
}

func TestListenAllServeAll(t *testing.T) {
	up := keepAliveUpstream(t, 0)
	p, err := New(Config{Services: []*Service{
		{Name: "a", Listen: []string{"127.0.0.1:0", "127.0.0.1:0"}, Upstream: up.addr()},
		{Name: "steered-only", Port: 1, Upstream: up.addr()},
	}})
	if err != nil {
		t.Fatal(err)
	}
	bound, err := p.ListenAll(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(bound) != 2 {
		t.Fatalf("bound %d listeners", len(bound))
	}
	served := make(chan error, 1)
	go func() { served <- p.ServeAll(bound) }()
	for _, b := range bound {
		c := dialClient(t, b.Listener.Addr().String())
		c.send("GET / HTTP/1.1\r\nHost: x\r\n\r\n")
		if r, _ := c.resp("GET"); r.StatusCode != 200 {
			t.Fatalf("status %d", r.StatusCode)
		}
	}
	if err := p.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := <-served; err != nil {
		t.Fatalf("ServeAll after Shutdown: %v", err)
	}
	// A listen error names the service and closes nothing it did not open.
	q, _ := New(Config{Services: []*Service{{Name: "bad", Listen: []string{"203.0.113.1:1"}, Upstream: up.addr()}}})
	if _, err := q.ListenAll(context.Background()); err == nil || !strings.Contains(err.Error(), "service bad") {
		t.Fatalf("ListenAll error %v", err)
	}
}

func TestIdleParking(t *testing.T) {
	up := keepAliveUpstream(t, 0)
	parked := make(chan struct{}, 10)
	p, addr := startProxy(t, nil, &Service{Upstream: up.addr(), IdleTimeout: time.Minute}, func(cfg *Config) {
		cfg.ParkIdleAfter = time.Millisecond
		cfg.testOnPark = func() {
			select {
			case parked <- struct{}{}:
			default:
			}
		}
	})
	// waitParked consumes park signals until the connection is parked now
	// (it may also have parked while waiting for its first request).
	waitParked := func() {
		for {
			<-parked
			if s := p.Stats(); s.Parked == 1 {
				if s.Conns != 1 {
					t.Fatalf("stats %+v", s)
				}
				return
			}
		}
	}
	c := dialClient(t, addr)
	for i := 0; i < 3; i++ {
		c.send("GET / HTTP/1.1\r\nHost: x\r\n\r\n")
		if r, body := c.resp("GET"); r.StatusCode != 200 || body != "ok" {
			t.Fatalf("request %d after parking: %d %q", i, r.StatusCode, body)
		}
		waitParked() // idle again: parked without a goroutine
	}
	// A pipelined pair after parking is served in order.
	c.send("GET /a HTTP/1.1\r\nHost: x\r\n\r\nGET /b HTTP/1.1\r\nHost: x\r\n\r\n")
	c.resp("GET")
	c.resp("GET")
	waitParked()
	// Drain closes parked connections.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := p.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	c.expectClosed()
	if s := p.Stats(); s.Parked != 0 || s.Conns != 0 {
		t.Fatalf("after drain: %+v", s)
	}
}

func TestParkedIdleTimeout(t *testing.T) {
	up := keepAliveUpstream(t, 0)
	parked := make(chan struct{}, 10)
	_, addr := startProxy(t, nil, &Service{Upstream: up.addr(), IdleTimeout: 100 * time.Millisecond}, func(cfg *Config) {
		cfg.ParkIdleAfter = time.Millisecond
		cfg.testParkSweep = 5 * time.Millisecond
		cfg.testOnPark = func() {
			select {
			case parked <- struct{}{}:
			default:
			}
		}
	})

	c := dialClient(t, addr)
	c.send("GET / HTTP/1.1\r\nHost: x\r\n\r\n")
	c.resp("GET")
	<-parked
	c.expectClosed() // the sweeper closes it after the idle timeout
}

func TestMaxBodyBytesChunked(t *testing.T) {
	up := httpUpstream(t, http.HandlerFunc(echoHandler))
	rules := make(chan string, 1)
	_, addr := startProxy(t, nil, &Service{Upstream: up, MaxBodyBytes: 8}, func(cfg *Config) {
		cfg.OnReject = func(_ *Service, _ netip.AddrPort, rule string, _ int) { rules <- rule }
	})
	c := dialClient(t, addr)
	c.send("POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n5\r\nworld\r\n0\r\n\r\n")
	if r, _ := c.resp("POST"); r.StatusCode != 413 || !r.Close {
		t.Fatalf("status %d close %v", r.StatusCode, r.Close)
	}
	if rule := <-rules; rule != "body-too-large" {
		t.Fatalf("rule %q", rule)
	}
	c2 := dialClient(t, addr)
	c2.send("POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n")
	if r, body := c2.resp("POST"); r.StatusCode != 200 || body != "POST / body=hello" {
		t.Fatalf("within limit: %d %q", r.StatusCode, body)
	}
}

// A client that goes away while admission waits is noticed even when its
// request body is already queued unread.
// TestClientAbortDuringAdmissionAfterParkDelay: the abort watcher keeps
// watching after the idle wait's short park deadline (ParkIdleAfter) has
// passed, although the head arrived whole with that wait's read.
func TestClientAbortDuringAdmissionAfterParkDelay(t *testing.T) {
	entered := make(chan struct{})
	hook := newTestHook(func(ctx context.Context, r *Request) Decision {
		time.Sleep(20 * time.Millisecond) // scenario: admission outlasts ParkIdleAfter
		close(entered)
		select {
		case <-ctx.Done():
		case <-time.After(20 * time.Second):
		}
		return Decision{Allow: true}
	})
	up := newRawUpstream(t, func(int, net.Conn) {})
	_, addr := startProxy(t, hook, &Service{Upstream: up.addr()}, func(cfg *Config) {
		cfg.ParkIdleAfter = time.Millisecond
	})
	c := dialClient(t, addr)
	c.send("GET / HTTP/1.1\r\nHost: x\r\n\r\n")
	<-entered
	c.c.Close()
	if d := hook.waitDone(t); !d.clientAborted || d.status != 0 {
		t.Fatalf("done %+v", d)
	}
	if up.count() != 0 {
		t.Fatal("aborted request reached the upstream")
	}
}

func TestClientAbortDuringAdmissionWithBody(t *testing.T) {
	entered := make(chan struct{})
	hook := newTestHook(func(ctx context.Context, r *Request) Decision {
		close(entered)
		select {
		case <-ctx.Done():
		case <-time.After(20 * time.Second):
		}
		return Decision{Allow: true}
	})
	up := newRawUpstream(t, func(int, net.Conn) {})
	_, addr := startProxy(t, hook, &Service{Upstream: up.addr()}, nil)
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
	_, addr := startProxy(t, hook, &Service{Upstream: up.addr()}, nil)
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
		_, addr := startProxy(t, nil, &Service{Upstream: up.addr()}, nil)
		c := dialClient(t, addr)
		c.send("GET / HTTP/1.1\r\nHost: x\r\n\r\n")
		c.resp("GET")
		<-closed // the FIN is queued at the proxy's pooled socket now
		// A POST is never retried: only the pre-use check saves it.
		c.send("POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabc")
		if r, body := c.resp("POST"); r.StatusCode != 200 || body != "ok" {
			t.Fatalf("POST on a checked pool: %d %q", r.StatusCode, body)
		}
		if up.count() != 2 {
			t.Fatalf("upstream connections %d, want 2", up.count())
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
		p, addr := startProxy(t, nil, &Service{Upstream: up.addr()}, func(cfg *Config) {
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

func TestSplitTarget(t *testing.T) {
	for _, tc := range []struct{ in, path, query string }{
		{"/", "/", ""},
		{"/a/b?x=1&y", "/a/b", "x=1&y"},
		{"/a?", "/a", ""},
		{"http://h:8/p?q=1", "/p", "q=1"},
		{"http://h:8", "", ""},
		{"http://h?q", "", "q"},
		{"*", "*", ""},
	} {
		p, q := splitTarget([]byte(tc.in))
		if string(p) != tc.path || string(q) != tc.query {
			t.Errorf("splitTarget(%q) = %q, %q; want %q, %q", tc.in, p, q, tc.path, tc.query)
		}
	}
}
