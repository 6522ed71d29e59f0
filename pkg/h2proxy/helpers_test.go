package h2proxy_test

import (
	"context"
	"net"
	"net/http"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"

	"github.com/rl-tproxy/rl-tproxy/internal/grpctest"
	"github.com/rl-tproxy/rl-tproxy/pkg/exchange"
	"github.com/rl-tproxy/rl-tproxy/pkg/h2proxy"
	"github.com/rl-tproxy/rl-tproxy/pkg/httpparse"
)

// startGRPC starts the gRPC upstream (h2c prior knowledge) on loopback.
func startGRPC(t testing.TB) (*grpctest.Echo, string) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	svc, stop := grpctest.Serve(ln)
	t.Cleanup(stop)
	return svc, ln.Addr().String()
}

// rec is a Hook that admits or denies by path and records every Done.
type rec struct {
	mu    sync.Mutex
	deny  map[string]bool
	block bool // Admit waits for ctx
	// blockPath: Admit waits for ctx for this path only.
	blockPath string
	admits    int
	dones     []exchange.Result
	paths     []string
	auth      []string
	// admitted lists the paths that reached Admit.
	admitted []string
}

func (h *rec) Admit(ctx context.Context, r *exchange.Request) exchange.Decision {
	h.mu.Lock()
	h.admits++
	h.auth = append(h.auth, string(r.Head.Host))
	h.admitted = append(h.admitted, string(r.Path))
	deny, block := h.deny[string(r.Path)], h.block || (h.blockPath != "" && h.blockPath == string(r.Path))
	h.mu.Unlock()
	if block {
		<-ctx.Done()
		return exchange.Decision{Status: 499}
	}
	if deny {
		return exchange.Decision{Status: 429, Body: []byte("denied\n"), ContentType: "text/plain",
			Header: []httpparse.Header{{Name: []byte("Retry-After"), Value: []byte("3")}, {Name: []byte("RateLimit-Policy"), Value: []byte(`"z";q=1;w=1`)}}}
	}
	return exchange.Decision{Allow: true}
}

func (h *rec) Done(r *exchange.Request, d *exchange.Decision, res *exchange.Result) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.dones = append(h.dones, *res)
	h.paths = append(h.paths, string(r.Path))
}

func (h *rec) GRPCDeny(*exchange.Decision) (int, string) { return 8, "rate limited by zone z" }

func (h *rec) doneCount() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.dones)
}

// startProxy serves HTTP/2 connections for svc through h2proxy (the
// standalone mode: the codec reads the preface itself).
func startProxy(t testing.TB, svc *exchange.Service, hook exchange.Hook) (*h2proxy.Server, string) {
	t.Helper()
	cfg := &exchange.Config{Services: []*exchange.Service{svc}, Hook: hook}
	return serveConns(t, func() (*exchange.Service, *exchange.Config) { return svc, cfg })
}

// serveConns serves each accepted connection with the service and
// configuration next returns at its accept, until the test ends.
func serveConns(t testing.TB, next func() (*exchange.Service, *exchange.Config)) (*h2proxy.Server, string) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := h2proxy.New()
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			svc, cfg := next()
			wg.Add(1)
			go func() { defer wg.Done(); srv.Serve(c, nil, svc, cfg) }()
		}
	}()
	t.Cleanup(func() {
		_ = ln.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
		wg.Wait()
	})
	return srv, ln.Addr().String()
}

func dialGRPC(t testing.TB, addr string) testgrpc.TestServiceClient {
	t.Helper()
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cc.Close() })
	return testgrpc.NewTestServiceClient(cc)
}

// h2cClient is an HTTP/2 prior-knowledge client (not gRPC).
func h2cClient() *http.Client {
	return &http.Client{Transport: h2cTransport()}
}

// h2cOneConn is a client whose every request goes over one h2c
// connection to addr, dialled through tr (closed at cleanup). A pooling
// Transport is no proof that requests shared a connection: it dials
// again whenever a request comes before the first connection is back in
// its pool, which a loaded machine makes happen.
func h2cOneConn(t *testing.T, tr *http.Transport, addr string) (*http.Client, *http.ClientConn) {
	t.Helper()
	cc, err := tr.NewClientConn(context.Background(), "http", addr)
	if err != nil {
		t.Fatalf("h2c connection to %s: %v", addr, err)
	}
	t.Cleanup(func() { cc.Close() })
	return &http.Client{Transport: cc}, cc
}

func limits(maxHeaders int) httpparse.Limits { return httpparse.Limits{MaxHeaders: maxHeaders} }

// admittedPath reports whether a request for path reached Admit.
func (h *rec) admittedPath(path string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, p := range h.admitted {
		if p == path {
			return true
		}
	}
	return false
}
