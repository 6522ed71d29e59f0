package h2proxy_test

import (
	"context"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rl-tproxy/rl-tproxy/internal/testkit"
	"github.com/rl-tproxy/rl-tproxy/pkg/exchange"
	"github.com/rl-tproxy/rl-tproxy/pkg/h2proxy"
	"github.com/rl-tproxy/rl-tproxy/pkg/hook"
	"github.com/rl-tproxy/rl-tproxy/pkg/httpparse"
)

var _ h2proxy.GRPCDenier = (*hook.Gate)(nil)

// startHTTP starts an HTTP upstream speaking HTTP/1.1 and, with h2c,
// HTTP/2 prior knowledge too. It echoes the request body and the
// request's protocol, headers and trailers back.
func startHTTP(t testing.TB, h2c bool) string {
	return serveHTTP(t, h2c, &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		w.Header().Set("X-Proto", r.Proto)
		w.Header().Set("X-Got-Trailer", r.Trailer.Get("X-Req-Trailer"))
		w.Header().Set("X-Got-Forward", r.Header.Get("X-Request-Id")+"|"+r.Header.Get("X-Forwarded-For"))
		w.Header().Set("X-Authority", r.Host)
		w.Header().Set("Trailer", "X-Res-Trailer")
		_, _ = w.Write(body)
		w.Header().Set("X-Res-Trailer", "done")
	})})
}

// serveHTTP serves s on a loopback port (HTTP/1.1, and h2c when asked)
// until the test ends.
func serveHTTP(t testing.TB, h2c bool, s *http.Server) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var p http.Protocols
	p.SetHTTP1(true)
	p.SetUnencryptedHTTP2(h2c)
	s.Protocols = &p
	go func() { _ = s.Serve(ln) }()
	t.Cleanup(func() { _ = s.Close() })
	return ln.Addr().String()
}

// TestUpstreamProtocols: an HTTP/2 client reaches an HTTP/1.1 upstream
// (http1) or an HTTP/2 one (auto, h2c); request and response trailers,
// the hook's forward fields and the forwarding headers cross both.
func TestUpstreamProtocols(t *testing.T) {
	for _, tc := range []struct{ proto, want string }{{h2proxy.ProtoHTTP1, "HTTP/1.1"}, {h2proxy.ProtoAuto, "HTTP/2.0"}, {h2proxy.ProtoH2C, "HTTP/2.0"}} {
		t.Run(tc.proto, func(t *testing.T) {
			up := startHTTP(t, true)
			h := &fwdHook{}
			_, addr := startProxy(t, &exchange.Service{Name: "s", Upstream: up, UpstreamProtocol: tc.proto, XForwardedFor: true}, h)
			pr, pw := io.Pipe()
			req, _ := http.NewRequest("POST", "http://"+addr+"/echo?q=1", pr)
			req.Host = "svc.example"
			req.Header.Set("X-Request-Id", "client-value")
			req.Trailer = http.Header{"X-Req-Trailer": nil}
			go func() {
				_, _ = io.WriteString(pw, strings.Repeat("b", 100000))
				req.Trailer.Set("X-Req-Trailer", "tr")
				_ = pw.Close()
			}()
			cl := h2cClient()
			defer cl.CloseIdleConnections()
			res, err := cl.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			body, err := io.ReadAll(res.Body)
			_ = res.Body.Close()
			if err != nil || len(body) != 100000 {
				t.Fatalf("body %d %v", len(body), err)
			}
			for k, want := range map[string]string{"X-Proto": tc.want, "X-Got-Trailer": "tr", "X-Got-Forward": "hook-value|127.0.0.1", "X-Authority": "svc.example", "X-Allow-Extra": "1"} {
				if got := res.Header.Get(k); got != want {
					t.Errorf("%s = %q, want %q", k, got, want)
				}
			}
			if got := res.Trailer.Get("X-Res-Trailer"); got != "done" {
				t.Errorf("response trailer %q", got)
			}
			testkit.WaitFor(t, "Done", func() bool { h.mu.Lock(); defer h.mu.Unlock(); return h.res.End != (time.Time{}) })
			h.mu.Lock()
			defer h.mu.Unlock()
			if h.res.Upstream != up || h.res.UpstreamStatus != 200 || h.res.BytesIn != 100000 || h.res.BytesOut != 100000 || h.proto != exchange.ProtoH2 {
				t.Errorf("result %+v proto %q", h.res, h.proto)
			}
		})
	}
}

// fwdHook admits with a forward field and an extra response field.
type fwdHook struct {
	mu    sync.Mutex
	res   exchange.Result
	proto string
}

func (h *fwdHook) Admit(context.Context, *exchange.Request) exchange.Decision {
	return exchange.Decision{Allow: true,
		Forward: []httpparse.Header{{Name: []byte("X-Request-Id"), Value: []byte("hook-value")}},
		Header:  []httpparse.Header{{Name: []byte("X-Allow-Extra"), Value: []byte("1")}}}
}

func (h *fwdHook) Done(r *exchange.Request, _ *exchange.Decision, res *exchange.Result) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.res, h.proto = *res, r.Proto
}

// TestUpstreamDown: a gRPC call to a dead upstream ends UNAVAILABLE, a
// plain request gets 502; the result carries the upstream error.
func TestUpstreamDown(t *testing.T) {
	dead := testkit.RefusedAddr(t)
	h := &rec{}
	_, addr := startProxy(t, &exchange.Service{Name: "s", Upstream: dead}, h)
	cl := h2cClient()
	defer cl.CloseIdleConnections()
	res, err := cl.Get("http://" + addr + "/")
	if err != nil || res.StatusCode != 502 {
		t.Fatalf("%v %v", res, err)
	}
	testkit.WaitFor(t, "Done", func() bool { return h.doneCount() == 1 })
	if h.dones[0].UpstreamErr == nil || h.dones[0].Status != 502 {
		t.Errorf("result %+v", h.dones[0])
	}
}

// TestDrain: Shutdown sends GOAWAY; a stream in flight finishes, the
// connection then ends, and a connection handed off afterwards is closed.
func TestDrain(t *testing.T) {
	release := make(chan struct{})
	started := make(chan struct{}, 1)
	upLn, _ := net.Listen("tcp", "127.0.0.1:0")
	var p http.Protocols
	p.SetUnencryptedHTTP2(true)
	us := &http.Server{Protocols: &p, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/slow" {
			// a probe below that reached the upstream before the GOAWAY
			// reached the client: answer it, it must not wait for release
			_, _ = io.WriteString(w, "early")
			return
		}
		started <- struct{}{}
		<-release
		_, _ = io.WriteString(w, "late")
	})}
	go func() { _ = us.Serve(upLn) }()
	defer us.Close()
	srv, addr := startProxy(t, &exchange.Service{Name: "s", Upstream: upLn.Addr().String()}, &rec{})
	cl := h2cClient()
	defer cl.CloseIdleConnections()
	type out struct {
		body string
		err  error
	}
	done := make(chan out, 1)
	go func() {
		res, err := cl.Get("http://" + addr + "/slow")
		if err != nil {
			done <- out{err: err}
			return
		}
		b, err := io.ReadAll(res.Body)
		_ = res.Body.Close()
		done <- out{string(b), err}
	}()
	<-started
	drained := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		drained <- srv.Shutdown(ctx)
	}()
	// The GOAWAY reaches the client: a new request on the same client
	// needs a new connection, which the draining server closes.
	testkit.WaitFor(t, "new streams refused", func() bool {
		res, err := cl.Get("http://" + addr + "/new")
		if err == nil {
			_ = res.Body.Close()
		}
		return err != nil
	})
	close(release)
	if o := <-done; o.err != nil || o.body != "late" {
		t.Fatalf("in-flight stream: %q %v", o.body, o.err)
	}
	if err := <-drained; err != nil {
		t.Fatalf("drain: %v", err)
	}
}

// TestUpstreamResetReachesClient: an upstream that resets its stream after
// part of the body makes the proxy reset the client's stream (the client
// sees an error, not a short body that looks complete), and the result
// carries the upstream error.
func TestUpstreamResetReachesClient(t *testing.T) {
	upLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var p http.Protocols
	p.SetUnencryptedHTTP2(true)
	us := &http.Server{Protocols: &p, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, "partial")
		http.NewResponseController(w).Flush()
		panic(http.ErrAbortHandler) // RST_STREAM to the proxy
	})}
	go func() { _ = us.Serve(upLn) }()
	defer us.Close()
	h := &rec{}
	_, addr := startProxy(t, &exchange.Service{Name: "s", Upstream: upLn.Addr().String()}, h)
	cl := h2cClient()
	defer cl.CloseIdleConnections()
	res, err := cl.Get("http://" + addr + "/")
	if err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(res.Body)
	_ = res.Body.Close()
	if err == nil {
		t.Fatalf("body %q read to a clean end; want a stream reset", body)
	}
	testkit.WaitFor(t, "Done", func() bool { return h.doneCount() == 1 })
	if h.dones[0].UpstreamErr == nil {
		t.Errorf("result %+v: no upstream error", h.dones[0])
	}
}

// TestUpstreamGOAWAY: an upstream that ends its connection with a GOAWAY
// (here its idle timeout) does not fail the next stream: the pool dials a
// new connection, and the client's connection to the proxy is untouched.
func TestUpstreamGOAWAY(t *testing.T) {
	upLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	opened, closed := 0, 0
	var p http.Protocols
	p.SetUnencryptedHTTP2(true)
	us := &http.Server{Protocols: &p, IdleTimeout: 50 * time.Millisecond,
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = io.WriteString(w, "ok") }),
		ConnState: func(_ net.Conn, s http.ConnState) {
			mu.Lock()
			defer mu.Unlock()
			switch s {
			case http.StateNew:
				opened++
			case http.StateClosed:
				closed++
			}
		}}
	go func() { _ = us.Serve(upLn) }()
	defer us.Close()
	_, addr := startProxy(t, &exchange.Service{Name: "s", Upstream: upLn.Addr().String()}, &rec{})
	cl := h2cClient()
	defer cl.CloseIdleConnections()
	get := func() {
		t.Helper()
		res, err := cl.Get("http://" + addr + "/")
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(res.Body)
		_ = res.Body.Close()
		if res.StatusCode != 200 || string(b) != "ok" {
			t.Fatalf("%d %q", res.StatusCode, b)
		}
	}
	get()
	testkit.WaitFor(t, "the upstream to close its idle connection (GOAWAY)", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return closed == 1
	})
	get()
	mu.Lock()
	defer mu.Unlock()
	if opened != 2 {
		t.Errorf("upstream connections opened: %d, want 2 (a new one after the GOAWAY)", opened)
	}
}

// TestUpstreamHeadTimeout: an upstream that never answers gets the
// service's upstream timeout (counted from the end of the request body):
// the client gets 504 (a gRPC client DEADLINE_EXCEEDED), the result
// names the timeout, and the upstream's request is cancelled, over both
// upstream protocols.
func TestUpstreamHeadTimeout(t *testing.T) {
	for _, proto := range []string{h2proxy.ProtoH2C, h2proxy.ProtoHTTP1} {
		t.Run(proto, func(t *testing.T) {
			upLn, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			var mu sync.Mutex
			cancelled := 0
			var p http.Protocols
			p.SetHTTP1(true)
			p.SetUnencryptedHTTP2(true)
			us := &http.Server{Protocols: &p, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				// Read the body first: an HTTP/1.1 server notices a closed
				// connection only once the body was read.
				_, _ = io.Copy(io.Discard, r.Body)
				<-r.Context().Done() // never answers; the proxy must give up
				mu.Lock()
				cancelled++
				mu.Unlock()
			})}
			go func() { _ = us.Serve(upLn) }()
			defer us.Close()
			h := &rec{}
			svc := &exchange.Service{Name: "s", Upstream: upLn.Addr().String(), UpstreamProtocol: proto, UpstreamTimeout: 100 * time.Millisecond}
			_, addr := startProxy(t, svc, h)
			cl := h2cClient()
			cl.Timeout = 30 * time.Second // a proxy that never gives up fails the test
			defer cl.CloseIdleConnections()
			res, err := cl.Get("http://" + addr + "/")
			if err != nil {
				t.Fatal(err)
			}
			_ = res.Body.Close()
			if res.StatusCode != http.StatusGatewayTimeout {
				t.Fatalf("status %d, want 504", res.StatusCode)
			}
			req, _ := http.NewRequest("POST", "http://"+addr+"/pkg.Svc/Call", strings.NewReader("\x00\x00\x00\x00\x00"))
			req.Header.Set("Content-Type", "application/grpc")
			res, err = cl.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			_, _ = io.Copy(io.Discard, res.Body)
			_ = res.Body.Close()
			if got := res.Header.Get("Grpc-Status") + res.Trailer.Get("Grpc-Status"); got != "4" {
				t.Errorf("gRPC call: grpc-status %q, want 4 (DEADLINE_EXCEEDED)", got)
			}
			testkit.WaitFor(t, "2 Done", func() bool { return h.doneCount() == 2 })
			h.mu.Lock()
			for _, d := range h.dones {
				if d.UpstreamErr == nil || !strings.Contains(d.UpstreamErr.Error(), "no response head") {
					t.Errorf("result error %v", d.UpstreamErr)
				}
			}
			h.mu.Unlock()
			testkit.WaitFor(t, "the upstream's requests to be cancelled", func() bool {
				mu.Lock()
				defer mu.Unlock()
				return cancelled == 2
			})
		})
	}
}

// TestUpstreamHostName: an upstream named by host name (localhost, Go's
// resolver) is reached on every upstream protocol; DialUpstream looks the
// name up (exchange.Config.DialUpstream).
func TestUpstreamHostName(t *testing.T) {
	for _, proto := range []string{h2proxy.ProtoHTTP1, h2proxy.ProtoH2C} {
		t.Run(proto, func(t *testing.T) {
			_, port, _ := net.SplitHostPort(startHTTP(t, true))
			_, addr := startProxy(t, &exchange.Service{Name: "s", Upstream: "localhost:" + port, UpstreamProtocol: proto}, &rec{})
			cl := h2cClient()
			defer cl.CloseIdleConnections()
			res, err := cl.Get("http://" + addr + "/")
			if err != nil {
				t.Fatal(err)
			}
			_ = res.Body.Close()
			if res.StatusCode != 200 {
				t.Fatalf("status %d", res.StatusCode)
			}
		})
	}
}
