package h2proxy_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/rl-tproxy/rl-tproxy/pkg/exchange"
	"github.com/rl-tproxy/rl-tproxy/pkg/h2proxy"
	"github.com/rl-tproxy/rl-tproxy/pkg/proxyproto"
)

// ppListener reads a PROXY v1 line from every accepted connection and
// records it, then hands the connection on.
type ppListener struct {
	net.Listener
	mu      sync.Mutex
	headers []string
}

type bufConn struct {
	net.Conn
	r *bufio.Reader
}

func (c *bufConn) Read(p []byte) (int, error) { return c.r.Read(p) }

func (l *ppListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		br := bufio.NewReader(c)
		line, err := br.ReadString('\n')
		if err != nil {
			c.Close()
			continue
		}
		l.mu.Lock()
		l.headers = append(l.headers, line)
		l.mu.Unlock()
		return &bufConn{Conn: c, r: br}, nil
	}
}

// TestProxyProtocolHTTP2: with proxy_protocol, each HTTP/2 client
// connection gets its own upstream connection(s), each starting with a
// PROXY header naming that client; streams of one client share them.
func TestProxyProtocolHTTP2(t *testing.T) {
	for _, upProto := range []string{h2proxy.ProtoHTTP1, h2proxy.ProtoH2C} {
		t.Run(upProto, func(t *testing.T) {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			pl := &ppListener{Listener: ln}
			var p http.Protocols
			p.SetHTTP1(true)
			p.SetUnencryptedHTTP2(true)
			srv := &http.Server{Protocols: &p, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				io.WriteString(w, r.Proto)
			})}
			go srv.Serve(pl)
			t.Cleanup(func() { srv.Close() })
			_, addr := startProxy(t, &exchange.Service{Name: "pp", Upstream: ln.Addr().String(), UpstreamProtocol: upProto,
				ProxyProtocol: proxyproto.V1}, nil)
			var want []string
			for client := 0; client < 2; client++ {
				// A client of its own (its own connection), dialled so
				// that its local port is known.
				conn, err := net.Dial("tcp", addr)
				if err != nil {
					t.Fatal(err)
				}
				tr := h2cTransport()
				tr.DialContext = func(context.Context, string, string) (net.Conn, error) { return conn, nil }
				cl, cc := h2cOneConn(t, tr, addr)
				for i := 0; i < 3; i++ {
					res, err := cl.Get("http://" + addr + "/")
					if err != nil {
						t.Fatal(err)
					}
					io.ReadAll(res.Body)
					res.Body.Close()
					if res.StatusCode != 200 {
						t.Fatalf("status %d", res.StatusCode)
					}
				}
				cc.Close()
				lp := conn.LocalAddr().(*net.TCPAddr).Port
				want = append(want, fmt.Sprintf("PROXY TCP4 127.0.0.1 127.0.0.1 %d %s\r\n", lp, strings.Split(addr, ":")[1]))
			}
			pl.mu.Lock()
			defer pl.mu.Unlock()
			if len(pl.headers) != 2 || pl.headers[0] != want[0] || pl.headers[1] != want[1] {
				t.Fatalf("upstream headers %q, want %q", pl.headers, want)
			}
		})
	}
}
