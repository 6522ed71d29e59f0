package proxy

import (
	"context"
	"net/http"
	"runtime"
	"testing"
	"time"

	"github.com/rl-tproxy/rl-tproxy/pkg/exchange"
)

// startDrainProxy serves svc on loopback without the startProxy cleanup
// (the test shuts down itself).
func startDrainProxy(t *testing.T, svc *exchange.Service, mod func(*Config)) (*Proxy, string, chan error) {
	t.Helper()
	cfg := Config{Config: exchange.Config{Services: []*exchange.Service{svc}}}
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
	go func() { served <- p.Serve(ln, p.Config().Services[0]) }()
	return p, ln.Addr().String(), served
}

func waitConns(t *testing.T, p *Proxy, n int) {
	t.Helper()
	for i := 0; p.Stats().Conns < n; i++ {
		if i > 1000000 {
			t.Fatalf("%d connections accepted, want %d", p.Stats().Conns, n)
		}
		runtime.Gosched()
	}
}

// A drain closes idle keep-alive connections, but a just-accepted one
// whose first request is still on its way gets that request served
// (bounded by the header timeout).
func TestDrainServesFreshConnection(t *testing.T) {
	up := httpUpstream(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.Write([]byte("done")) }))
	t.Run("first-request-served", func(t *testing.T) { testDrainFresh(t, up) })
	t.Run("silent-closed-after-header-timeout", func(t *testing.T) {
		p, addr, served := startDrainProxy(t, &exchange.Service{Name: "w", Upstream: up, HeaderTimeout: 20 * time.Millisecond}, nil)
		silent := dialClient(t, addr)
		waitConns(t, p, 1)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := p.Shutdown(ctx); err != nil {
			t.Fatalf("Shutdown did not end the silent connection: %v", err)
		}
		silent.expectClosed()
		<-served
	})
}

// testDrainFresh: an idle and a fresh connection when the drain starts;
// the fresh one's request is served.
func testDrainFresh(t *testing.T, up string) {
	p, addr, served := startDrainProxy(t, &exchange.Service{Name: "w", Upstream: up}, nil)
	idle := dialClient(t, addr)
	idle.send("GET / HTTP/1.1\r\nHost: x\r\n\r\n")
	idle.resp("GET")
	fresh := dialClient(t, addr)
	waitConns(t, p, 2)
	shut := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		shut <- p.Shutdown(ctx)
	}()
	idle.expectClosed() // the drain has run over the connections
	fresh.send("GET / HTTP/1.1\r\nHost: x\r\n\r\n")
	r, body := fresh.resp("GET")
	if r.StatusCode != 200 || body != "done" || !r.Close {
		t.Fatalf("fresh connection: %d %q close=%v", r.StatusCode, body, r.Close)
	}
	fresh.expectClosed()
	if err := <-shut; err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	if err := <-served; err != ErrClosed {
		t.Fatalf("Serve: %v", err)
	}

}
