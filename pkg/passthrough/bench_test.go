package passthrough

import (
	"context"
	"io"
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/rl-tproxy/rl-tproxy/pkg/exchange"
	"github.com/rl-tproxy/rl-tproxy/pkg/proxy"
)

// BenchmarkRelayBulk sends 64 KiB chunks through an opaque passthrough
// relay (spliced) to a discarding service, beside the same transfer made
// directly; it reports the process's CPU time per chunk (client, relay and
// service all run in this process).
func BenchmarkRelayBulk(b *testing.B) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { io.Copy(io.Discard, c); c.Close() }()
		}
	}()
	relayed := startBench(b, &exchange.Service{Name: "bulk", Upstream: ln.Addr().String()})
	for _, tc := range []struct{ name, addr string }{{"direct", ln.Addr().String()}, {"relay", relayed}} {
		b.Run(tc.name, func(b *testing.B) {
			c, err := net.Dial("tcp", tc.addr)
			if err != nil {
				b.Fatal(err)
			}
			defer c.Close()
			chunk := make([]byte, 64<<10)
			chunk[0] = 0 // opaque
			b.SetBytes(int64(len(chunk)))
			cpu0 := cpuTime()
			b.ResetTimer()
			for range b.N {
				if _, err := c.Write(chunk); err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			b.ReportMetric(float64((cpuTime()-cpu0).Nanoseconds())/float64(b.N), "cpu-ns/op")
		})
	}
}

func startBench(b *testing.B, svc *exchange.Service) string {
	relay := &Relay{}
	p, err := proxy.New(proxy.Config{Config: exchange.Config{Services: []*exchange.Service{svc}}, Handoff: &exchange.HandoffMux{TLS: relay, Other: relay}})
	if err != nil {
		b.Fatal(err)
	}
	ln, err := proxy.Listen(b.Context(), "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	go p.Serve(ln, svc)
	b.Cleanup(func() { p.Shutdown(context.Background()); closeSplicePipes() })
	return ln.Addr().String()
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
