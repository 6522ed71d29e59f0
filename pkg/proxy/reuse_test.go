package proxy

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rl-tproxy/rl-tproxy/pkg/exchange"
)

// Upstreams that misbehave must never make one client's response reach
// another client: a pooled connection is reused only when nothing is left
// to read on it.

// idOf returns the request id carried in the target "/id/ID".
func idOf(head string) (method, id string) {
	line, _, _ := strings.Cut(head, "\r\n")
	f := strings.Fields(line)
	if len(f) < 2 {
		return "", ""
	}
	return f[0], strings.TrimPrefix(f[1], "/id/")
}

// okResp is a well-formed response carrying id in X-Id and (unless HEAD)
// in the body.
func okResp(method, id string) string {
	body := id
	if method == "HEAD" {
		body = ""
	}
	return fmt.Sprintf("HTTP/1.1 200 OK\r\nX-Id: %s\r\nContent-Length: %d\r\n\r\n%s", id, len(id), body)
}

// misbehave is an upstream behaviour: it answers request n (counted per
// upstream connection) of method/id by writing to c.
type misbehave func(c net.Conn, n int, method, id string) error

var misbehaviours = map[string]misbehave{
	// Stray bytes after every third complete response, in the same write.
	"stray-bytes": func(c net.Conn, n int, method, id string) error {
		r := okResp(method, id)
		if n%3 == 0 {
			r += "STRAY-RESPONSE-BYTES " + id
		}
		_, err := io.WriteString(c, r)
		return err
	},
	// HEAD answered with a body (Content-Length bytes really sent).
	"head-with-body": func(c net.Conn, n int, method, id string) error {
		r := okResp(method, id)
		if method == "HEAD" && n%2 == 0 {
			r += id
		}
		_, err := io.WriteString(c, r)
		return err
	},
	// A second, complete response sent early, before its request.
	"early-second-response": func(c net.Conn, n int, method, id string) error {
		r := okResp(method, id)
		if n%3 == 1 {
			r += okResp("GET", "early-"+id)
		}
		_, err := io.WriteString(c, r)
		return err
	},
	// A large body (relayed by splice, not through the buffer) followed by
	// stray bytes: what remains sits in the socket, not in the buffer.
	"large-body-then-stray": func(c net.Conn, n int, method, id string) error {
		body := strings.Repeat("b", 100<<10-len(id)) + id
		if method == "HEAD" {
			_, err := io.WriteString(c, fmt.Sprintf("HTTP/1.1 200 OK\r\nX-Id: %s\r\nContent-Length: %d\r\n\r\n", id, len(body)))
			return err
		}
		head := fmt.Sprintf("HTTP/1.1 200 OK\r\nX-Id: %s\r\nContent-Length: %d\r\n\r\n", id, len(body))
		cut := len(body) - 16
		if _, err := io.WriteString(c, head+body[:cut]); err != nil {
			return err
		}
		tail := body[cut:]
		if n%2 == 0 {
			tail += "HTTP/1.1 200 OK\r\nX-Id: stray\r\nContent-Length: 5\r\n\r\nSTRAY"
		}
		_, err := io.WriteString(c, tail) // one small write: end and stray arrive together
		return err
	},
}

func serveMisbehaving(fn misbehave) func(int, net.Conn) {
	return func(_ int, c net.Conn) {
		br := bufio.NewReader(c)
		for n := 0; ; n++ {
			head, err := readRequestHead(br)
			if err != nil {
				return
			}
			method, id := idOf(head)
			if fn(c, n, method, id) != nil {
				return
			}
		}
	}
}

func TestUpstreamMisbehaviourNeverCrossDelivers(t *testing.T) {
	const clients, perClient = 8, 250
	for name, fn := range misbehaviours {
		t.Run(name, func(t *testing.T) {
			up := newRawUpstream(t, serveMisbehaving(fn))
			p, addr := startProxy(t, allowHook{}, &exchange.Service{Upstream: up.addr()}, nil)
			var wrong, total atomic.Int64
			var wg sync.WaitGroup
			errs := make(chan error, clients)
			for k := 0; k < clients; k++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					errs <- runIDClient(addr, k, perClient, &wrong, &total)
				}()
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				if err != nil {
					t.Error(err)
				}
			}
			if w := wrong.Load(); w != 0 {
				t.Fatalf("%d of %d responses reached the wrong client", w, total.Load())
			}
			if total.Load() != clients*perClient {
				t.Fatalf("%d responses, want %d", total.Load(), clients*perClient)
			}
			if s := p.Stats(); s.UpstreamDiscarded == 0 {
				t.Fatalf("no upstream connection was discarded: %+v", s)
			}
		})
	}
}

// runIDClient sends n requests on one keep-alive connection (every fourth
// a HEAD), each with its own id, and checks that every response carries
// that id and that nothing follows the last one.
func runIDClient(addr string, k, n int, wrong, total *atomic.Int64) error {
	c, err := net.Dial("tcp", addr)
	if err != nil {
		return err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(time.Minute)) // a bound, not a measurement
	br := bufio.NewReader(c)
	for i := 0; i < n; i++ {
		id := fmt.Sprintf("c%d-r%d", k, i)
		method := "GET"
		if i%4 == 3 {
			method = "HEAD"
		}
		conn := ""
		if i == n-1 {
			conn = "Connection: close\r\n"
		}
		if _, err := fmt.Fprintf(c, "%s /id/%s HTTP/1.1\r\nHost: x\r\n%s\r\n", method, id, conn); err != nil {
			return fmt.Errorf("client %d request %d: %w", k, i, err)
		}
		gotID, body, err := readIDResponse(br, method)
		if err != nil {
			return fmt.Errorf("client %d request %s: %w", k, id, err)
		}
		total.Add(1)
		if gotID != id || method == "GET" && !strings.HasSuffix(body, id) {
			wrong.Add(1)
		}
	}
	rest, err := io.ReadAll(br)
	if err != nil && !isReset(err) {
		return fmt.Errorf("client %d after the last response: %w", k, err)
	}
	if len(rest) != 0 {
		return fmt.Errorf("client %d: %d stray bytes after the last response: %.60q", k, len(rest), rest)
	}
	return nil
}

// readIDResponse reads one 200 response with Content-Length framing and
// returns its X-Id and body.
func readIDResponse(br *bufio.Reader, method string) (id, body string, err error) {
	head, err := readRequestHead(br) // a response head has the same shape
	if err != nil {
		return "", "", err
	}
	if !strings.HasPrefix(head, "HTTP/1.1 200 ") {
		return "", "", fmt.Errorf("response %.80q", head)
	}
	id = headerOf(head, "X-Id")
	if method == "HEAD" {
		return id, "", nil
	}
	var cl int
	if _, err := fmt.Sscan(headerOf(head, "Content-Length"), &cl); err != nil {
		return "", "", fmt.Errorf("content-length in %.80q: %w", head, err)
	}
	b := make([]byte, cl)
	if _, err := io.ReadFull(br, b); err != nil {
		return "", "", err
	}
	return id, string(b), nil
}

// A stray response that arrives while the connection sits idle in the
// pool (well within any "recently used" window) is never handed to the
// next request, even a POST that cannot be retried.
func TestUpstreamStrayWhileIdleDiscarded(t *testing.T) {
	for _, tc := range []struct{ name, first, stray string }{
		{"stray-response", "GET", "HTTP/1.1 200 OK\r\nX-Injected: 1\r\nContent-Length: 20\r\n\r\nSTRAY-RESPONSE-BYTES"},
		{"head-body-late", "HEAD", "c0-r0"},
		{"204-body-late", "GET", "body after 204"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			release := make(chan struct{})
			sent := make(chan struct{}, 1)
			up := newRawUpstream(t, func(conn int, c net.Conn) {
				br := bufio.NewReader(c)
				for n := 0; ; n++ {
					first := conn == 1 && n == 0
					head, err := readRequestHead(br)
					if err != nil {
						return
					}
					method, id := idOf(head)
					if first && tc.name == "204-body-late" {
						io.WriteString(c, "HTTP/1.1 204 No Content\r\nX-Id: "+id+"\r\n\r\n")
					} else {
						if strings.HasPrefix(method, "POST") {
							br.Discard(3)
						}
						io.WriteString(c, okResp(method, id))
					}
					if first {
						<-release
						io.WriteString(c, tc.stray)
						sent <- struct{}{}
					}
				}
			})
			p, addr := startProxy(t, nil, &exchange.Service{Upstream: up.addr()}, nil)
			c := dialClient(t, addr)
			c.send(tc.first + " /id/c0-r0 HTTP/1.1\r\nHost: x\r\n\r\n")
			id, _, err := readIDResponse2xx(c.br, tc.first)
			if err != nil || id != "c0-r0" {
				t.Fatalf("first response: id %q, %v", id, err)
			}
			close(release)
			<-sent // the stray bytes are queued at the proxy's pooled socket
			c.send("POST /id/c0-r1 HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabc")
			id, body, err := readIDResponse(c.br, "POST")
			if err != nil || id != "c0-r1" || body != "c0-r1" {
				t.Fatalf("second response: id %q body %q, %v", id, body, err)
			}
			if up.count() != 2 || p.Stats().UpstreamDiscarded != 1 {
				t.Fatalf("upstream connections %d, stats %+v; want 2 and 1 discarded", up.count(), p.Stats())
			}
		})
	}
}

// readIDResponse2xx is readIDResponse that also accepts a bodyless 204.
func readIDResponse2xx(br *bufio.Reader, method string) (string, string, error) {
	b, err := br.Peek(12)
	if err == nil && string(b) == "HTTP/1.1 204" {
		head, err := readRequestHead(br)
		return headerOf(head, "X-Id"), "", err
	}
	return readIDResponse(br, method)
}
