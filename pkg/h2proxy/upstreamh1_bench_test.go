package h2proxy_test

import (
	"bufio"
	"net"
	"testing"

	"github.com/rl-tproxy/rl-tproxy/pkg/exchange"
	"github.com/rl-tproxy/rl-tproxy/pkg/h2proxy"
)

// rawHTTP1Upstream answers every request head (no body) with a fixed
// small response, the cheapest upstream there is, so that -benchmem
// shows the client's and the proxy's allocations.
func rawHTTP1Upstream(b *testing.B) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	const resp = "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nServer: bench\r\nContent-Length: 2\r\n\r\nok"
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				br, bw := bufio.NewReader(c), bufio.NewWriter(c)
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
			}()
		}
	}()
	b.Cleanup(func() { _ = ln.Close() })
	return ln.Addr().String()
}

// BenchmarkH2ProxiedHTTP1Upstream measures one HTTP/2 request through
// h2proxy to an HTTP/1.1 upstream (upstream_protocol http1): the
// response head and body come through the HTTP/1.1 client.
func BenchmarkH2ProxiedHTTP1Upstream(b *testing.B) {
	up := rawHTTP1Upstream(b)
	_, addr := startProxy(b, &exchange.Service{Name: "b", Upstream: up, UpstreamProtocol: h2proxy.ProtoHTTP1}, allowHook{})
	benchGet(b, "http://"+addr+"/")
}
