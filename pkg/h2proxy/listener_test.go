package h2proxy_test

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/status"

	"github.com/rl-tproxy/rl-tproxy/internal/grpctest"
	"github.com/rl-tproxy/rl-tproxy/pkg/exchange"
	"github.com/rl-tproxy/rl-tproxy/pkg/h2proxy"
	"github.com/rl-tproxy/rl-tproxy/pkg/proxy"
)

// startListenerProxy runs the whole data path in listener mode: pkg/proxy
// accepts, its protocol dispatch hands HTTP/2 connections to h2proxy, and
// HTTP/1.1 stays on the proxy's own path, on one port.
func startListenerProxy(t testing.TB, svc *exchange.Service, hook exchange.Hook) (*proxy.Proxy, string) {
	t.Helper()
	h2 := h2proxy.New()
	p, err := proxy.New(proxy.Config{Config: exchange.Config{Services: []*exchange.Service{svc}, Hook: hook}, Handoff: &exchange.HandoffMux{HTTP2: h2}})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- p.Serve(ln, svc) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = p.Shutdown(ctx)
		if err := <-served; err != nil && !errors.Is(err, proxy.ErrClosed) && !errors.Is(err, net.ErrClosed) {
			t.Errorf("serve: %v", err)
		}
		_ = h2.Shutdown(ctx) // the proxy drains its own connections, not the handoff's
	})
	return p, ln.Addr().String()
}

// TestListenerModeSamePort: gRPC (all four call kinds), HTTP/2 requests
// and HTTP/1.1 requests on the same listener port.
func TestListenerModeSamePort(t *testing.T) {
	_, upAddr := startGRPC(t)
	h := &rec{deny: map[string]bool{"/grpc.testing.TestService/EmptyCall": true}}
	_, addr := startListenerProxy(t, &exchange.Service{Name: "g", Upstream: upAddr}, h)
	runGRPCKinds(t, dialGRPC(t, addr))

	// HTTP/1.1 on the same port reaches the proxy's own path: the gRPC
	// upstream does not speak HTTP/1.1, so the answer is the proxy's 502
	// (or the upstream's refusal), never an HTTP/2 frame.
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_, _ = io.WriteString(c, "GET /plain HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
	_ = c.SetReadDeadline(time.Now().Add(30 * time.Second))
	b, _ := io.ReadAll(c)
	if !strings.HasPrefix(string(b), "HTTP/1.1 ") {
		t.Fatalf("HTTP/1.1 answer: %q", b)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	found := false
	for _, p := range h.admitted {
		found = found || p == "/plain"
	}
	if !found {
		t.Errorf("the HTTP/1.1 request was not admitted through the hook: %v", h.admitted)
	}
}

// runGRPCKinds makes one call of each kind and a denied one.
func runGRPCKinds(t *testing.T, cl testgrpc.TestServiceClient) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := grpctest.CallKinds(ctx, cl); err != nil {
		t.Fatal(err)
	}
	if _, err := cl.EmptyCall(ctx, &testgrpc.Empty{}); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("denied call: %v", err)
	}
}

// TestListenerDrainGOAWAY: the proxy's drain reaches HTTP/2 connections as
// a GOAWAY; a stream in flight completes.
func TestListenerDrainGOAWAY(t *testing.T) {
	release := make(chan struct{})
	started := make(chan struct{}, 1)
	upLn, _ := net.Listen("tcp", "127.0.0.1:0")
	var pr http.Protocols
	pr.SetUnencryptedHTTP2(true)
	us := &http.Server{Protocols: &pr, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		started <- struct{}{}
		<-release
		_, _ = io.WriteString(w, "late")
	})}
	go func() { _ = us.Serve(upLn) }()
	defer us.Close()
	p, addr := startListenerProxy(t, &exchange.Service{Name: "s", Upstream: upLn.Addr().String()}, &rec{})
	rc := dialRaw(t, addr)
	if err := rc.fr.WriteHeaders(http2HeadersEnd(1, rc.headerBlock("/slow"))); err != nil {
		t.Fatal(err)
	}
	<-started
	drained := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		drained <- p.Shutdown(ctx)
	}()
	sawGoaway, sawData := false, false
	_ = rc.c.SetReadDeadline(time.Now().Add(30 * time.Second))
	for !sawData {
		f, err := rc.fr.ReadFrame()
		if err != nil {
			t.Fatalf("read: %v (goaway %v)", err, sawGoaway)
		}
		switch f.Header().Type.String() {
		case "GOAWAY":
			if !sawGoaway {
				sawGoaway = true
				close(release) // the stream finishes after the GOAWAY
			}
		case "DATA":
			sawData = true
		}
	}
	if !sawGoaway {
		t.Fatal("no GOAWAY before the in-flight stream's data")
	}
	_ = rc.c.Close()
	if err := <-drained; err != nil {
		t.Fatalf("drain: %v", err)
	}
}
