package h2proxy_test

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rl-tproxy/rl-tproxy/internal/testkit"
	"github.com/rl-tproxy/rl-tproxy/pkg/exchange"
	"github.com/rl-tproxy/rl-tproxy/pkg/h2proxy"
)

// closeCountingHTTP starts an upstream (HTTP/1.1 and h2c) that counts
// the connections it saw close.
func closeCountingHTTP(t *testing.T, closed *atomic.Int32) string {
	return serveHTTP(t, true, &http.Server{Handler: http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}),
		ConnState: func(_ net.Conn, st http.ConnState) {
			if st == http.StateClosed {
				closed.Add(1)
			}
		}})
}

// TestUpstreamSweep: after a reload moves a service to another upstream,
// the transport for the old one is closed and forgotten at the sweep
// after a period without streams, while requests to the new one go on.
func TestUpstreamSweep(t *testing.T) {
	for _, proto := range []string{h2proxy.ProtoHTTP1, h2proxy.ProtoH2C} {
		t.Run(proto, func(t *testing.T) {
			sweep := *h2proxy.UpstreamSweep
			*h2proxy.UpstreamSweep = 10 * time.Millisecond
			t.Cleanup(func() { *h2proxy.UpstreamSweep = sweep })
			var closedA, closedB atomic.Int32
			upA, upB := closeCountingHTTP(t, &closedA), closeCountingHTTP(t, &closedB)
			var svc atomic.Pointer[exchange.Service]
			svc.Store(&exchange.Service{Name: "s", Upstream: upA, UpstreamProtocol: proto})
			srv, addr := serveCurrent(t, &svc)

			get := func() {
				t.Helper()
				cl := h2cClient()
				defer cl.CloseIdleConnections()
				if st := getStatus(t, cl, "http://"+addr+"/"); st != 200 {
					t.Fatalf("status %d", st)
				}
			}
			get()
			// The 10ms sweep may already have dropped upA's transport on
			// a busy machine (its connection's close is checked below);
			// no other may be there.
			if a := h2proxy.UpstreamAddrs(srv); len(a) > 1 || len(a) == 1 && a[0] != upA {
				t.Fatalf("transports for %v, want %s (or none)", a, upA)
			}
			svc.Store(&exchange.Service{Name: "s", Upstream: upB, UpstreamProtocol: proto})
			testkit.WaitFor(t, "the old upstream's transport to go", func() bool {
				get()
				return !slices.Contains(h2proxy.UpstreamAddrs(srv), upA)
			})
			testkit.WaitFor(t, "the old upstream's connection to close", func() bool { return closedA.Load() == 1 })
			get()

			// A stream in flight through a transport the sweep drops
			// still gets its answer.
			entered, release := make(chan struct{}), make(chan struct{})
			upC := serveHTTP(t, true, &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
				close(entered)
				<-release
				_, _ = w.Write([]byte("late"))
			})})
			svc.Store(&exchange.Service{Name: "s", Upstream: upC, UpstreamProtocol: proto})
			done := make(chan error, 1)
			go func() {
				cl := h2cClient()
				defer cl.CloseIdleConnections()
				res, err := cl.Get("http://" + addr + "/")
				if err == nil {
					b, _ := io.ReadAll(res.Body)
					_ = res.Body.Close()
					if string(b) != "late" {
						err = fmt.Errorf("status %d, body %q", res.StatusCode, b)
					}
				}
				done <- err
			}()
			<-entered
			testkit.WaitFor(t, "the sweep to drop the transport in use", func() bool { return len(h2proxy.UpstreamAddrs(srv)) == 0 })
			close(release)
			if err := <-done; err != nil {
				t.Fatalf("stream in flight across the sweep: %v", err)
			}
		})
	}
}

// serveCurrent serves each accepted connection with the service svc
// holds at its accept (a reload between connections).
func serveCurrent(t *testing.T, svc *atomic.Pointer[exchange.Service]) (*h2proxy.Server, string) {
	return serveConns(t, func() (*exchange.Service, *exchange.Config) {
		s := svc.Load()
		return s, &exchange.Config{Services: []*exchange.Service{s}, Hook: &rec{}}
	})
}
