package h2proxy_test

import (
	"context"
	"io"
	"net/http"
	"testing"

	"github.com/rl-tproxy/rl-tproxy/pkg/exchange"
)

// BenchmarkH2Proxied measures one HTTP/2 request through h2proxy (admitted
// by a hook that allows) to an h2c upstream, client and upstream in the
// same process: -benchmem shows the proxy's allocations per request plus
// the client's and the upstream's (BenchmarkH2Direct is that baseline).
func BenchmarkH2Proxied(b *testing.B) {
	up := startHTTP(b, true)
	_, addr := startProxy(b, &exchange.Service{Name: "b", Upstream: up}, allowHook{})
	benchGet(b, "http://"+addr+"/")
}

// BenchmarkH2Direct is the same request straight to the upstream.
func BenchmarkH2Direct(b *testing.B) {
	benchGet(b, "http://"+startHTTP(b, true)+"/")
}

func benchGet(b *testing.B, url string) {
	cl := h2cClient()
	defer cl.CloseIdleConnections()
	b.ReportAllocs()
	b.SetParallelism(8)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			res, err := cl.Get(url)
			if err != nil {
				b.Error(err)
				return
			}
			_, _ = io.Copy(io.Discard, res.Body)
			_ = res.Body.Close()
			if res.StatusCode != http.StatusOK {
				b.Errorf("status %d", res.StatusCode)
				return
			}
		}
	})
}

// allowHook admits everything and records nothing.
// allowHook admits at once; like hook.Gate it is a exchange.ContextBound
// Hook (it returns whatever its context does), so the benchmarks measure
// the production path: Admit on the stream's goroutine.
type allowHook struct{}

func (allowHook) AdmitReturnsOnContextEnd() {}

func (allowHook) Admit(context.Context, *exchange.Request) exchange.Decision {
	return exchange.Decision{Allow: true}
}
func (allowHook) Done(*exchange.Request, *exchange.Decision, *exchange.Result) {}
