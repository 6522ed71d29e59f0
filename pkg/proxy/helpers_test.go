package proxy

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rl-tproxy/rl-tproxy/pkg/exchange"
)

// testHook records admissions and completions; decide picks the Decision.
type testHook struct {
	mu     sync.Mutex
	decide func(ctx context.Context, r *exchange.Request) exchange.Decision
	admits []string // "METHOD PATH?QUERY"
	dones  []doneRec
	doneCh chan doneRec
	// Admit calls minus Done calls; must end at 0 and never go negative.
	pending  atomic.Int64
	overDone atomic.Bool
}

type doneRec struct {
	target         string
	allow          bool
	status         int
	clientAborted  bool
	upstreamErr    error
	admissionErr   error
	bytesIn        int64
	bytesOut       int64
	startBeforeEnd bool
}

func newTestHook(decide func(ctx context.Context, r *exchange.Request) exchange.Decision) *testHook {
	if decide == nil {
		decide = func(context.Context, *exchange.Request) exchange.Decision { return exchange.Decision{Allow: true} }
	}
	return &testHook{decide: decide, doneCh: make(chan doneRec, 100)}
}

func (h *testHook) Admit(ctx context.Context, r *exchange.Request) exchange.Decision {
	h.mu.Lock()
	t := string(r.Path)
	if r.Query != nil {
		t += "?" + string(r.Query)
	}
	h.admits = append(h.admits, string(r.Head.Method)+" "+t)
	h.mu.Unlock()
	h.pending.Add(1)
	return h.decide(ctx, r)
}

func (h *testHook) Done(r *exchange.Request, d *exchange.Decision, res *exchange.Result) {
	if h.pending.Add(-1) < 0 {
		h.overDone.Store(true)
	}
	rec := doneRec{target: string(r.Head.Target), allow: d.Allow, status: res.Status,
		clientAborted: res.ClientAborted, upstreamErr: res.UpstreamErr, admissionErr: res.AdmissionErr,
		bytesIn: res.BytesIn, bytesOut: res.BytesOut, startBeforeEnd: !res.End.Before(r.Start)}
	h.mu.Lock()
	h.dones = append(h.dones, rec)
	h.mu.Unlock()
	h.doneCh <- rec
}

func (h *testHook) waitDone(t *testing.T) doneRec {
	t.Helper()
	select {
	case d := <-h.doneCh:
		return d
	case <-time.After(10 * time.Second):
		t.Fatal("Done was not called")
	}
	return doneRec{}
}

func (h *testHook) admitted() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]string(nil), h.admits...)
}

// startProxy serves svc (Upstream filled by the caller) on a loopback
// listener and returns the proxy and its address.
// checkRequestsReleased fails t when no client connection is left but
// the loops still count a request in progress (Stats.Requests, which
// gates the kernel wait): a request state taken and never given back.
func checkRequestsReleased(t testing.TB, p *Proxy, when string) {
	t.Helper()
	if st := p.Stats(); st.Conns == 0 && st.Requests != 0 {
		t.Errorf("%s: no client connection open but %d requests in progress on the loops", when, st.Requests)
	}
}

func startProxy(t testing.TB, hook exchange.Hook, svc *exchange.Service, mod func(*Config)) (*Proxy, string) {
	t.Helper()
	if svc.Name == "" {
		svc.Name = "web"
	}
	cfg := Config{Config: exchange.Config{Services: []*exchange.Service{svc}}}
	if hook != nil {
		cfg.Hook = hook
	}
	if mod != nil {
		mod(&cfg)
	}
	p, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := Listen(context.Background(), "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- p.Serve(ln, svc) }()
	t.Cleanup(func() {
		checkRequestsReleased(t, p, "at the test's end")
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := p.Shutdown(ctx); err != nil {
			t.Errorf("shutdown: %v", err)
		}
		checkRequestsReleased(t, p, "after Shutdown")
		// Every request that reached Admit got exactly one Done.
		if th, ok := hook.(*testHook); ok && (th.pending.Load() != 0 || th.overDone.Load()) {
			t.Errorf("Admit/Done imbalance: pending %d, Done without Admit %v", th.pending.Load(), th.overDone.Load())
		}
		if err := <-served; err != ErrClosed {
			t.Errorf("Serve returned %v, want ErrClosed", err)
		}
		// Large bodies go through splice, whose pipes the runtime keeps
		// in a sync.Pool and closes only from a finalizer once two GC
		// cycles dropped them: run those, or TestMain's descriptor check
		// finds them open whenever no GC happened to follow the last one.
		runtime.GC()
		runtime.GC()
	})
	return p, ln.Addr().String()
}

// httpUpstream starts a net/http server on loopback.
func httpUpstream(t *testing.T, h http.Handler) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: h}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return ln.Addr().String()
}

// rawUpstream runs fn for every accepted connection (in its own goroutine)
// and counts connections.
type rawUpstream struct {
	ln    net.Listener
	mu    sync.Mutex
	conns int
	wg    sync.WaitGroup
}

func newRawUpstream(t *testing.T, fn func(n int, c net.Conn)) *rawUpstream {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	u := &rawUpstream{ln: ln}
	// The accept loop holds a count itself, so that a connection's Add
	// never races with Wait at a zero count.
	u.wg.Add(1)
	go func() {
		defer u.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			u.mu.Lock()
			u.conns++
			n := u.conns
			u.mu.Unlock()
			u.wg.Add(1)
			go func() {
				defer u.wg.Done()
				defer c.Close()
				fn(n, c)
			}()
		}
	}()
	t.Cleanup(func() { ln.Close(); u.wg.Wait() })
	return u
}

func (u *rawUpstream) addr() string { return u.ln.Addr().String() }

func (u *rawUpstream) count() int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.conns
}

// headUpstream starts an upstream that, for each request head it reads
// (bodies are not read), sends the head to heads and writes answer(head).
func headUpstream(t *testing.T, heads chan<- string, answer func(head string) string) *rawUpstream {
	return newRawUpstream(t, func(_ int, c net.Conn) {
		br := bufio.NewReader(c)
		for {
			head, err := readRequestHead(br)
			if err != nil {
				return
			}
			heads <- head
			io.WriteString(c, answer(head))
		}
	})
}

// readRequestHead reads one request head (up to CRLFCRLF) from br.
func readRequestHead(br *bufio.Reader) (string, error) {
	var sb strings.Builder
	for {
		line, err := br.ReadString('\n')
		sb.WriteString(line)
		if err != nil {
			return sb.String(), err
		}
		if line == "\r\n" {
			return sb.String(), nil
		}
	}
}

// client is a raw HTTP/1.1 client connection.
type client struct {
	t  *testing.T
	c  net.Conn
	br *bufio.Reader
}

func dialClient(t *testing.T, addr string) *client {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	c.SetDeadline(time.Now().Add(20 * time.Second))
	t.Cleanup(func() { c.Close() })
	return &client{t: t, c: c, br: bufio.NewReader(c)}
}

func (c *client) send(s string) {
	c.t.Helper()
	if _, err := io.WriteString(c.c, s); err != nil {
		c.t.Fatal(err)
	}
}

// resp reads a response to a request with the given method.
func (c *client) resp(method string) (*http.Response, string) {
	c.t.Helper()
	r, err := http.ReadResponse(c.br, &http.Request{Method: method})
	if err != nil {
		c.t.Fatalf("read response: %v", err)
	}
	b, err := io.ReadAll(r.Body)
	if err != nil {
		c.t.Fatalf("read body: %v", err)
	}
	return r, string(b)
}

// expectClosed asserts the proxy closes the connection (EOF, nothing more).
func (c *client) expectClosed() {
	c.t.Helper()
	b, err := io.ReadAll(c.br)
	if err != nil && !isReset(err) {
		c.t.Fatalf("expected close, got %v", err)
	}
	if len(b) != 0 {
		c.t.Fatalf("expected close, got %q", b)
	}
}

func isReset(err error) bool {
	return err != nil && strings.Contains(err.Error(), "connection reset")
}

// noLeak fails if the goroutine count does not settle back to base.
func noLeak(t *testing.T, base int) {
	t.Helper()
	for i := 0; i < 200000; i++ { // exiting goroutines need a few schedules
		if runtime.NumGoroutine() <= base {
			return
		}
		runtime.Gosched()
	}
	buf := make([]byte, 1<<16)
	n := runtime.Stack(buf, true)
	t.Fatalf("goroutines: %d > %d\n%s", runtime.NumGoroutine(), base, buf[:n])
}
