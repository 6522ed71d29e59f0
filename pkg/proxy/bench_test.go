package proxy

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"testing"

	"github.com/rl-tproxy/rl-tproxy/pkg/exchange"
)

var fixedResponse = []byte("HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 13\r\n\r\nhello, world\n")

// fastUpstream answers every request head with resp, without allocating
// per request (so allocation counts measure the proxy alone). Requests
// must have no body.
func fastUpstream(tb testing.TB, resp []byte) string {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				buf := make([]byte, 64<<10)
				n := 0
				for {
					m, err := c.Read(buf[n:])
					if err != nil {
						return
					}
					n += m
					for {
						i := bytes.Index(buf[:n], []byte("\r\n\r\n"))
						if i < 0 {
							break
						}
						if _, err := c.Write(resp); err != nil {
							return
						}
						n = copy(buf, buf[i+4:n])
					}
					if n == len(buf) {
						return
					}
				}
			}()
		}
	}()
	return ln.Addr().String()
}

// benchClient does keep-alive round trips whose answer length is learnt
// from the first response.
type benchClient struct {
	c    net.Conn
	req  []byte
	buf  []byte
	size int
}

func newBenchClient(tb testing.TB, addr string) *benchClient {
	tb.Helper()
	return newBenchClientReq(tb, addr, []byte("GET /bench?x=1 HTTP/1.1\r\nHost: bench\r\nUser-Agent: b\r\nAccept: */*\r\n\r\n"))
}

// newBenchClientReq is newBenchClient sending req (a whole request, body
// included) instead of its GET.
func newBenchClientReq(tb testing.TB, addr string, req []byte) *benchClient {
	tb.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { c.Close() })
	bc := &benchClient{c: c, req: req, buf: make([]byte, 4096)}
	if _, err := c.Write(bc.req); err != nil {
		tb.Fatal(err)
	}
	cr := &countingReader{r: c}
	r, err := http.ReadResponse(bufio.NewReaderSize(cr, 1), nil)
	if err != nil {
		tb.Fatal(err)
	}
	io.ReadAll(r.Body)
	if r.StatusCode != 200 {
		tb.Fatalf("status %d", r.StatusCode)
	}
	bc.size = cr.n
	if bc.size > len(bc.buf) {
		bc.buf = make([]byte, bc.size)
	}
	return bc
}

type countingReader struct {
	r io.Reader
	n int
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += n
	return n, err
}

func (bc *benchClient) roundTrip() error {
	if _, err := bc.c.Write(bc.req); err != nil {
		return err
	}
	_, err := io.ReadFull(bc.c, bc.buf[:bc.size])
	return err
}

func benchProxy(b *testing.B, hook exchange.Hook, parallel bool) {
	up := fastUpstream(b, fixedResponse)
	svc := &exchange.Service{Name: "bench", Upstream: up, XForwardedFor: true}
	_, addr := startProxy(b, hook, svc, nil)
	b.ReportAllocs()
	if !parallel {
		bc := newBenchClient(b, addr)
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			if err := bc.roundTrip(); err != nil {
				b.Fatal(err)
			}
		}
		return
	}
	b.SetParallelism(4)
	b.RunParallel(func(pb *testing.PB) {
		bc := newBenchClient(b, addr)
		for pb.Next() {
			if err := bc.roundTrip(); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

// BenchmarkProxyGET: one keep-alive client, GET through the proxy (no
// admission hook) to a loopback upstream.
func BenchmarkProxyGET(b *testing.B) { benchProxy(b, nil, false) }

// bigResponse is a keep-alive response with a 1 MiB body.
var bigResponse = append([]byte("HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\nContent-Length: 1048576\r\n\r\n"),
	bytes.Repeat([]byte("0123456789abcdef"), 1<<16)...)

// BenchmarkProxyGET1MiB relays 1 MiB bodies through one keep-alive
// connection, copied through the write queue or spliced (bytes/s,
// allocations).
func BenchmarkProxyGET1MiB(b *testing.B) {
	for _, bc := range []struct {
		name      string
		spliceMin int64
	}{{"copy", -1}, {"splice", 0}} {
		b.Run(bc.name, func(b *testing.B) {
			up := fastUpstream(b, bigResponse)
			_, addr := startProxy(b, nil, &exchange.Service{Name: "bench", Upstream: up}, func(cfg *Config) {
				cfg.EventLoops, cfg.SpliceMin = 1, bc.spliceMin
			})
			c := newBenchClient(b, addr)
			b.SetBytes(int64(c.size))
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if err := c.roundTrip(); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkProxyGETParallel: 4×GOMAXPROCS keep-alive clients.
func BenchmarkProxyGETParallel(b *testing.B) { benchProxy(b, nil, true) }

// BenchmarkProxyGETHook: as BenchmarkProxyGET with an allow-all hook (the
// client-abort watcher and admission context run per request).
func BenchmarkProxyGETHook(b *testing.B) { benchProxy(b, allowHook{}, false) }

// BenchmarkDirectGET is the baseline: the same client straight to the
// upstream.
func BenchmarkDirectGET(b *testing.B) {
	up := fastUpstream(b, fixedResponse)
	bc := newBenchClient(b, up)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if err := bc.roundTrip(); err != nil {
			b.Fatal(err)
		}
	}
}

type allowHook struct{}

func (allowHook) Admit(context.Context, *exchange.Request) exchange.Decision {
	return exchange.Decision{Allow: true}
}
func (allowHook) Done(*exchange.Request, *exchange.Decision, *exchange.Result) {}
