package h2proxy_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/rl-tproxy/rl-tproxy/pkg/exchange"
	"github.com/rl-tproxy/rl-tproxy/pkg/h2proxy"
	"github.com/rl-tproxy/rl-tproxy/pkg/httpparse"
)

// malformedResponses are upstream HTTP/1.1 responses every client
// protocol must see refused: each is one a lenient parser reads one way
// and a strict one another (or not at all), the ground response
// smuggling and desync stand on. bodyBad marks the ones whose fault is
// in the body: the head reached the client before the fault did.
var malformedResponses = []struct {
	name    string
	resp    string
	bodyBad bool
}{
	{name: "duplicate Content-Length", resp: "HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nhello!"},
	{name: "space before colon", resp: "HTTP/1.1 200 OK\r\nContent-Length : 5\r\n\r\nhello"},
	{name: "obs-fold", resp: "HTTP/1.1 200 OK\r\nContent-Length: 5\r\nX-Folded: a\r\n b\r\n\r\nhello"},
	{name: "bad chunk size", resp: "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5 \r\nhello\r\n0\r\n\r\n", bodyBad: true},
	{name: "Content-Length with Transfer-Encoding", resp: "HTTP/1.1 200 OK\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n"},
	{name: "NUL in a field", resp: "HTTP/1.1 200 OK\r\nContent-Length: 5\r\nX-Nul: a\x00b\r\n\r\nhello"},
	{name: "4-digit status", resp: "HTTP/1.1 2000 OK\r\nContent-Length: 5\r\n\r\nhello"},
	// A field line ended by a bare LF: a parser that takes LF as a line
	// end sees Content-Length and X-After; one that does not sees a
	// field value holding both.
	{name: "bare LF", resp: "HTTP/1.1 200 OK\r\nContent-Length: 5\nX-After: 1\r\n\r\nhello"},
	// More of the same kinds.
	{name: "chunk size not hex", resp: "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0x5\r\nhello\r\n0\r\n\r\n", bodyBad: true},
	{name: "Content-Length with a sign", resp: "HTTP/1.1 200 OK\r\nContent-Length: +5\r\n\r\nhello"},
	{name: "Transfer-Encoding not chunked", resp: "HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n"},
	{name: "chunk data without CRLF", resp: "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhelloXX0\r\n\r\n", bodyBad: true},
}

// verdictUpstream is an HTTP/1.1 upstream that answers /bad with a fixed
// malformed response and anything else with a valid one, and records
// which paths every connection carried and when each one closed.
type verdictUpstream struct {
	addr   string
	bad    string
	mu     sync.Mutex
	conns  [][]string    // paths per accepted connection
	closed chan int      // connection indexes, as the proxy closes them
	badOn  chan int      // the connection a /bad request arrived on
	stop   chan struct{} // closed at cleanup
}

func startVerdictUpstream(t *testing.T, bad string) *verdictUpstream {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	u := &verdictUpstream{addr: ln.Addr().String(), bad: bad, closed: make(chan int, 64), badOn: make(chan int, 64), stop: make(chan struct{})}
	var wg sync.WaitGroup
	var open sync.Map
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			u.mu.Lock()
			i := len(u.conns)
			u.conns = append(u.conns, nil)
			u.mu.Unlock()
			open.Store(c, true)
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer open.Delete(c)
				u.serve(i, c)
			}()
		}
	}()
	t.Cleanup(func() {
		close(u.stop)
		_ = ln.Close()
		open.Range(func(k, _ any) bool { _ = k.(net.Conn).Close(); return true })
		wg.Wait()
	})
	return u
}

func (u *verdictUpstream) serve(i int, c net.Conn) {
	defer c.Close()
	br := bufio.NewReader(c)
	for {
		req, err := http.ReadRequest(br)
		if err != nil {
			u.closed <- i
			return
		}
		_, _ = io.Copy(io.Discard, req.Body)
		u.mu.Lock()
		u.conns[i] = append(u.conns[i], req.URL.Path)
		u.mu.Unlock()
		resp := "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
		if req.URL.Path == "/bad" {
			resp = u.bad
			u.badOn <- i
		}
		if _, err := io.WriteString(c, resp); err != nil {
			u.closed <- i
			return
		}
	}
}

// waitClosed waits until the proxy closed upstream connection i: a
// connection that answered malformed bytes is never pooled.
func (u *verdictUpstream) waitClosed(t *testing.T, i int) {
	t.Helper()
	bound := time.NewTimer(10 * time.Second) // a failure bound, not a synchronisation
	defer bound.Stop()
	for {
		select {
		case j := <-u.closed:
			if j == i {
				return
			}
		case <-bound.C:
			u.mu.Lock()
			defer u.mu.Unlock()
			t.Errorf("upstream connection %d (paths %v) still open 10s after its malformed response: pooled", i, u.conns[i])
			return
		}
	}
}

// resultHook admits every request and hands each Result over.
type resultHook struct{ done chan exchange.Result }

func (h *resultHook) Admit(context.Context, *exchange.Request) exchange.Decision {
	return exchange.Decision{Allow: true}
}

func (h *resultHook) Done(_ *exchange.Request, _ *exchange.Decision, res *exchange.Result) {
	h.done <- *res
}

func (h *resultHook) next(t *testing.T) exchange.Result {
	t.Helper()
	select {
	case r := <-h.done:
		return r
	case <-time.After(10 * time.Second): // a failure bound
		t.Fatal("no Done within 10s")
		return exchange.Result{}
	}
}

// verdictOutcome is what a client saw of a response.
type verdictOutcome struct {
	status  int
	body    string
	bodyErr error
}

func (o verdictOutcome) String() string {
	return fmt.Sprintf("status %d, body %q, body error %v", o.status, o.body, o.bodyErr)
}

// h1Get sends GET path over a new HTTP/1.1 connection to addr.
func h1Get(t *testing.T, addr, path string) verdictOutcome {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(20 * time.Second)) // a failure bound
	if _, err := io.WriteString(c, "GET "+path+" HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	res, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		return verdictOutcome{bodyErr: fmt.Errorf("head: %w", err)}
	}
	b, err := io.ReadAll(res.Body)
	return verdictOutcome{status: res.StatusCode, body: string(b), bodyErr: err}
}

// h2Get sends GET path over HTTP/2 (h2c) with cl.
func h2Get(t *testing.T, cl *http.Client, addr, path string) verdictOutcome {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second) // a failure bound
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", "http://"+addr+path, nil)
	res, err := cl.Do(req)
	if err != nil {
		return verdictOutcome{bodyErr: fmt.Errorf("head: %w", err)}
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	return verdictOutcome{status: res.StatusCode, body: string(b), bodyErr: err}
}

// TestMalformedUpstreamResponseRefusedForEveryClient: each malformed
// response of an HTTP/1.1 upstream is refused the same way whether an
// HTTP/1.1 client (the event loops) or an HTTP/2 client (h2proxy,
// upstream_protocol http1) asked: 502 when the fault is in the head, the
// response cut (connection closed, stream reset) when it is in the body
// and the head went out; the Result carries the upstream error; the
// upstream connection is closed, never pooled; the next request is served
// on a new connection. Both paths name the same broken rule.
func TestMalformedUpstreamResponseRefusedForEveryClient(t *testing.T) {
	for _, tc := range malformedResponses {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			up := startVerdictUpstream(t, tc.resp)
			h := &resultHook{done: make(chan exchange.Result, 8)}
			svc := &exchange.Service{Name: "s", Upstream: up.addr, UpstreamProtocol: h2proxy.ProtoHTTP1, UpstreamTimeout: 20 * time.Second}
			_, addr := startListenerProxy(t, svc, h)
			h2 := h2cClient()
			defer h2.CloseIdleConnections()
			var rules []*httpparse.Error // each client's verdict
			for _, client := range []struct {
				name string
				get  func(path string) verdictOutcome
			}{
				{"HTTP/1.1", func(p string) verdictOutcome { return h1Get(t, addr, p) }},
				{"HTTP/2", func(p string) verdictOutcome { return h2Get(t, h2, addr, p) }},
			} {
				got := client.get("/bad")
				res := h.next(t)
				switch {
				case !tc.bodyBad && got.status != http.StatusBadGateway:
					t.Errorf("%s client: %v; want 502", client.name, got)
				case tc.bodyBad && (got.status != http.StatusOK || got.bodyErr == nil):
					t.Errorf("%s client: %v; want the head (200), then the body cut", client.name, got)
				}
				var rule *httpparse.Error
				if !errors.As(res.UpstreamErr, &rule) {
					t.Errorf("%s client: Result.UpstreamErr %v, want an httpparse rule (result %+v)", client.name, res.UpstreamErr, res)
				}
				rules = append(rules, rule)
				t.Logf("%s client: %v; upstream error: %v", client.name, got, res.UpstreamErr)
				up.waitClosed(t, <-up.badOn)
				if ok := client.get("/ok"); ok.status != 200 || ok.body != "ok" || ok.bodyErr != nil {
					t.Errorf("%s client, the next request: %v", client.name, ok)
				}
				h.next(t)
			}
			if rules[0] != rules[1] {
				t.Errorf("verdicts differ: %v for the HTTP/1.1 client, %v for the HTTP/2 client", rules[0], rules[1])
			}
			up.mu.Lock()
			defer up.mu.Unlock()
			for i, paths := range up.conns {
				if len(paths) > 1 && paths[0] == "/bad" {
					t.Errorf("upstream connection %d carried %v: reused after a malformed response", i, paths)
				}
			}
		})
	}
}
