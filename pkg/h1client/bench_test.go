package h1client_test

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"testing"

	"github.com/rl-tproxy/rl-tproxy/pkg/h1client"
)

// benchUpstream answers every request head (no body) with resp, as fast
// as a loopback upstream can.
func benchUpstream(b testing.TB, resp string) string {
	u := startUpstream(b, func(_ int, c net.Conn, br *bufio.Reader) {
		bw := bufio.NewWriter(c)
		for {
			for {
				line, err := br.ReadSlice('\n')
				if err != nil {
					return
				}
				if len(line) == 2 {
					break
				}
			}
			_, _ = bw.WriteString(resp)
			if bw.Flush() != nil {
				return
			}
		}
	})
	return u.addr
}

// benchResponses are the upstream answers the benchmarks read.
var benchResponses = []struct{ name, resp string }{
	{"length", "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nDate: Mon, 07 Dec 2026 15:00:00 GMT\r\nServer: bench\r\nContent-Length: 2\r\n\r\nok"},
	{"chunked", "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nDate: Mon, 07 Dec 2026 15:00:00 GMT\r\nServer: bench\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n"},
}

// BenchmarkRoundTrip: one body-less GET and its whole response over a
// pooled connection, with the request's own cancellable context (as a
// proxied stream has), through h1client and through the net/http
// Transport it replaced (configured as h2proxy configured it).
func BenchmarkRoundTrip(b *testing.B) {
	for _, br := range benchResponses {
		addr := benchUpstream(b, br.resp)
		var protos http.Protocols
		protos.SetHTTP1(true)
		tr := &http.Transport{Protocols: &protos, DisableCompression: true, MaxIdleConnsPerHost: 256, MaxResponseHeaderBytes: 1 << 20}
		b.Cleanup(tr.CloseIdleConnections)
		for _, c := range []struct {
			name string
			rt   http.RoundTripper
		}{
			{"h1client", h1client.New(h1client.Config{Addr: addr, MaxIdle: 256})},
			{"transport", tr},
		} {
			b.Run(br.name+"/"+c.name, func(b *testing.B) {
				req, _ := http.NewRequest("GET", "http://"+addr+"/bench", nil)
				buf := make([]byte, 512)
				b.ReportAllocs()
				for b.Loop() {
					ctx, cancel := context.WithCancel(context.Background())
					res, err := c.rt.RoundTrip(req.WithContext(ctx))
					if err != nil {
						b.Fatal(err)
					}
					for {
						_, err := res.Body.Read(buf)
						if err == io.EOF {
							break
						}
						if err != nil {
							b.Fatal(err)
						}
					}
					_ = res.Body.Close()
					cancel()
				}
			})
		}
	}
}
