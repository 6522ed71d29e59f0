package proxy

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/rl-tproxy/rl-tproxy/internal/testkit"
	"github.com/rl-tproxy/rl-tproxy/pkg/exchange"
	"github.com/rl-tproxy/rl-tproxy/pkg/httpparse"
)

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
	_, addr := startProxy(t, hook, &exchange.Service{Upstream: up.addr(), HeaderTimeout: 5 * time.Second}, func(cfg *Config) {
		cfg.OnReject = func(_ *exchange.Service, _ netip.AddrPort, rule string, _ int) { rules <- rule }
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
		{"connection-options", "GET / HTTP/1.1\r\nHost: x\r\nConnection: " + connOptions("x-o", 17) + "\r\n\r\n", httpparse.ErrConnectionOptions},
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
	_, addr := startProxy(t, hook, &exchange.Service{Upstream: up}, nil)
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
	_, addr := startProxy(t, nil, &exchange.Service{Upstream: up}, nil)

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
	hook := newTestHook(func(ctx context.Context, r *exchange.Request) exchange.Decision {
		admitted <- struct{}{}
		if <-release {
			return exchange.Decision{Allow: true}
		}
		return exchange.Decision{Status: 429, Header: []httpparse.Header{{Name: []byte("Retry-After"), Value: []byte("1")}}}
	})
	_, addr := startProxy(t, hook, &exchange.Service{Upstream: up}, nil)
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
	_, addr := startProxy(t, nil, &exchange.Service{Upstream: up.addr()}, nil)
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
	_, addr := startProxy(t, nil, &exchange.Service{Upstream: up.addr()}, nil)
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
	_, addr := startProxy(t, hook, &exchange.Service{Upstream: up.addr()}, nil)
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

func TestForwardedHeaders(t *testing.T) {
	heads := make(chan string, 4)
	up := headUpstream(t, heads, func(string) string {
		return "HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: X-Up, keep-alive\r\nX-Up: secret\r\nKeep-Alive: timeout=5\r\nX-Keep: 1\r\n\r\n"
	})
	svc := &exchange.Service{Name: "web", Upstream: up.addr(), XForwardedFor: true, XForwardedProto: true, Forwarded: true, XRealIP: true}
	hook := newTestHook(func(context.Context, *exchange.Request) exchange.Decision {
		return exchange.Decision{Allow: true, Header: []httpparse.Header{{Name: []byte("RateLimit"), Value: []byte(`"p";r=9`)}}}
	})
	for _, host := range []string{"127.0.0.1", "[::1]"} {
		t.Run(host, func(t *testing.T) {
			p, err := New(Config{Config: exchange.Config{Services: []*exchange.Service{svc}, Hook: hook}})
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
	deny := func(ctx context.Context, r *exchange.Request) exchange.Decision {
		if string(r.Path) == "/deny" {
			return exchange.Decision{Status: 429, Header: []httpparse.Header{{Name: []byte("Retry-After"), Value: []byte("2")}},
				Body: []byte("slow down\n"), ContentType: "text/plain"}
		}
		return exchange.Decision{Allow: true}
	}
	hook := newTestHook(deny)
	_, addr := startProxy(t, hook, &exchange.Service{Upstream: up.addr()}, nil)
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
	_, addr := startProxy(t, nil, &exchange.Service{Upstream: up.addr(), MaxRequestsPerConn: 2}, nil)
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
	_, addr := startProxy(t, nil, &exchange.Service{Upstream: up.addr(), MaxBodyBytes: 10}, nil)
	c := dialClient(t, addr)
	c.send("POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 11\r\n\r\n")
	if r, _ := c.resp("POST"); r.StatusCode != 413 {
		t.Fatalf("status %d", r.StatusCode)
	}
}

func TestMaxBodyBytesChunked(t *testing.T) {
	up := httpUpstream(t, http.HandlerFunc(echoHandler))
	rules := make(chan string, 1)
	_, addr := startProxy(t, nil, &exchange.Service{Upstream: up, MaxBodyBytes: 8}, func(cfg *Config) {
		cfg.OnReject = func(_ *exchange.Service, _ netip.AddrPort, rule string, _ int) { rules <- rule }
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
