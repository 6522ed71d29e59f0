package proxy

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rl-tproxy/rl-tproxy/internal/testkit"
	"github.com/rl-tproxy/rl-tproxy/pkg/exchange"
)

// testSpliceMin is the tests' Config.SpliceMin: small, so that bodies of
// a few hundred KiB exercise the splice.
const testSpliceMin = 64 << 10

func spliceBody(n int, seed byte) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = 'a' + byte(i%26) ^ seed&7
	}
	return b
}

// sizedUpstream answers "GET /N" with an N-byte Content-Length body, or a
// close-delimited one for "GET /close/N"; X-Conn says which connection.
func sizedUpstream(t *testing.T, after func(n int) string) *rawUpstream {
	return newRawUpstream(t, func(conn int, c net.Conn) {
		br := bufio.NewReader(c)
		for {
			head, err := readRequestHead(br)
			if err != nil {
				return
			}
			path := strings.Fields(head)[1]
			closing := strings.HasPrefix(path, "/close/")
			n, _ := strconv.Atoi(strings.TrimPrefix(strings.TrimPrefix(path, "/close"), "/"))
			var w bytes.Buffer
			if closing {
				fmt.Fprintf(&w, "HTTP/1.1 200 OK\r\nX-Conn: %d\r\n\r\n", conn)
			} else {
				fmt.Fprintf(&w, "HTTP/1.1 200 OK\r\nContent-Length: %d\r\nX-Conn: %d\r\n\r\n", n, conn)
			}
			w.Write(spliceBody(n, byte(conn)))
			if after != nil {
				w.WriteString(after(n))
			}
			if _, err := c.Write(w.Bytes()); err != nil || closing {
				return
			}
		}
	})
}

// Bodies at and above Config.SpliceMin go by splice, exactly, on a
// keep-alive client connection and a pooled upstream one; smaller ones
// are copied; close-delimited ones are spliced once SpliceMin bytes went.
func TestSpliceResponseBodies(t *testing.T) {
	eachLoopBackend(t, func(t *testing.T) {
		up := sizedUpstream(t, nil)
		hook := newTestHook(nil)
		p, addr := startProxy(t, hook, &exchange.Service{Upstream: up.addr()}, func(c *Config) {
			c.EventLoops, c.SpliceMin = 1, testSpliceMin
		})
		c := dialClient(t, addr)
		for _, tc := range []struct {
			path    string
			n       int
			spliced bool
		}{
			{"/1000", 1000, false},
			{"/65535", 65535, false},
			{"/4194304", 4 << 20, true},
			{"/300001", 300001, true},
			{"/close/1048576", 1 << 20, true},
		} {
			before := p.Stats().Loops.Spliced
			c.send("GET " + tc.path + " HTTP/1.1\r\nHost: x\r\n\r\n")
			r, got := c.resp("GET")
			if r.StatusCode != 200 || got != string(spliceBody(tc.n, 1)) || r.Header.Get("X-Conn") != "1" {
				t.Fatalf("%s: status %d, %d bytes, conn %s", tc.path, r.StatusCode, len(got), r.Header.Get("X-Conn"))
			}
			if d := hook.waitDone(t); d.bytesOut < int64(tc.n) || d.upstreamErr != nil {
				t.Fatalf("%s: done %+v", tc.path, d)
			}
			spliced := p.Stats().Loops.Spliced - before
			if tc.spliced != (spliced > 0) || spliced > uint64(tc.n) {
				t.Fatalf("%s: %d bytes spliced of %d", tc.path, spliced, tc.n)
			}
		}
		c.expectClosed() // after the close-delimited body
		if st := p.Stats(); st.UpstreamDiscarded != 0 || st.Loops.Pipes > 16 {
			t.Fatalf("stats %+v", st)
		}
	})
}

// An upstream that sends more than its Content-Length after a spliced
// body (here a whole second response): the extra bytes never reach the
// client, and the connection is not pooled, so the next request cannot
// get them as its answer.
func TestSpliceUpstreamOversends(t *testing.T) {
	eachLoopBackend(t, func(t *testing.T) {
		up := sizedUpstream(t, func(int) string {
			return "HTTP/1.1 200 OK\r\nContent-Length: 4\r\nX-Conn: evil\r\n\r\nEVIL"
		})
		p, addr := startProxy(t, nil, &exchange.Service{Upstream: up.addr()}, func(c *Config) {
			c.EventLoops, c.SpliceMin = 1, testSpliceMin
		})
		c := dialClient(t, addr)
		// Pipelined: each next request is forwarded as soon as the body
		// before it went, in the same loop turn, before the stray bytes
		// could be read off a pooled connection.
		c.send(strings.Repeat("GET /200000 HTTP/1.1\r\nHost: x\r\n\r\n", 3))
		for i := 1; i <= 3; i++ {
			r, got := c.resp("GET")
			if r.StatusCode != 200 || got != string(spliceBody(200000, byte(i))) || r.Header.Get("X-Conn") != strconv.Itoa(i) {
				t.Fatalf("request %d: status %d, %d bytes, conn %q", i, r.StatusCode, len(got), r.Header.Get("X-Conn"))
			}
		}
		if st := p.Stats(); st.UpstreamDiscarded < 2 || st.Loops.Spliced == 0 {
			t.Fatalf("stats %+v: want the poisoned connections discarded, bytes spliced", st)
		}
	})
}

// An upstream that closes before its Content-Length: the client gets
// what came and then the connection's end (a truncated body, never a
// keep-alive), and Done reports the upstream's failure.
func TestSpliceUpstreamTruncates(t *testing.T) {
	eachLoopBackend(t, func(t *testing.T) {
		up := newRawUpstream(t, func(_ int, c net.Conn) {
			if _, err := readRequestHead(bufio.NewReader(c)); err != nil {
				return
			}
			io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 1000000\r\n\r\n")
			c.Write(spliceBody(400000, 0))
		})
		hook := newTestHook(nil)
		p, addr := startProxy(t, hook, &exchange.Service{Upstream: up.addr()}, func(c *Config) {
			c.EventLoops, c.SpliceMin = 1, testSpliceMin
		})
		c := dialClient(t, addr)
		c.send("GET / HTTP/1.1\r\nHost: x\r\n\r\n")
		r, err := http.ReadResponse(c.br, nil)
		if err != nil || r.StatusCode != 200 {
			t.Fatalf("%v %v", r, err)
		}
		b, err := io.ReadAll(r.Body)
		if !bytes.Equal(b, spliceBody(400000, 0)) || !errors.Is(err, io.ErrUnexpectedEOF) {
			t.Fatalf("%d bytes, err %v: the client must see the truncated body end", len(b), err)
		}
		if d := hook.waitDone(t); d.upstreamErr == nil || d.bytesOut < 400000 {
			t.Fatalf("done %+v", d)
		}
		if p.Stats().Loops.Spliced == 0 {
			t.Fatal("nothing spliced")
		}
	})
}

// endlessUpstream answers one request with a 1 GiB body it writes until
// a write fails (bounded by testkit.WaitBound), then sends the error.
func endlessUpstream(t *testing.T, wrote chan<- error) *rawUpstream {
	return newRawUpstream(t, func(_ int, c net.Conn) {
		if _, err := readRequestHead(bufio.NewReader(c)); err != nil {
			return
		}
		c.SetWriteDeadline(time.Now().Add(testkit.WaitBound))
		_, err := io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 1073741824\r\n\r\n")
		for b := spliceBody(1<<20, 0); err == nil; {
			_, err = c.Write(b)
		}
		wrote <- err
	})
}

// A client that vanishes (reset) or stops reading mid-body: the proxy
// closes the upstream connection (its writer fails) and holds nothing
// after: no connection, socket or pipe with bytes.
func TestSpliceClientGoneOrStalled(t *testing.T) {
	for _, how := range []string{"reset", "stalled"} {
		t.Run(how, func(t *testing.T) {
			eachLoopBackend(t, func(t *testing.T) {
				wrote := make(chan error, 1)
				up := endlessUpstream(t, wrote)
				svc := &exchange.Service{Upstream: up.addr()}
				if how == "stalled" {
					svc.IdleTimeout = 300 * time.Millisecond
				}
				p, addr := startProxy(t, nil, svc, func(c *Config) { c.EventLoops, c.SpliceMin = 1, testSpliceMin })
				c := dialClient(t, addr)
				c.send("GET / HTTP/1.1\r\nHost: x\r\n\r\n")
				if _, err := io.ReadFull(c.br, make([]byte, 256<<10)); err != nil {
					t.Fatal(err)
				}
				if how == "reset" {
					c.c.(*net.TCPConn).SetLinger(0)
					c.c.Close()
				}
				select {
				case err := <-wrote:
					if errors.Is(err, os.ErrDeadlineExceeded) {
						t.Fatalf("the upstream's writes never failed: %v", err)
					}
				case <-time.After(2 * testkit.WaitBound):
					t.Fatal("the upstream writer never returned")
				}
				testkit.WaitFor(t, "the proxy holds no connection", func() bool {
					st := p.Stats()
					return st.Conns == 0 && st.Loops.Sockets == 0 && st.Loops.Pipes <= 16 && st.Loops.Spliced > 0
				})
			})
		})
	}
}

// The exchange's idle deadline counts a splice's progress: when it
// passes, a splice that moved bytes since it was set extends it, one
// that did not ends the exchange. Both calls run in one loop callback,
// where the splice cannot move a byte in between.
func TestSpliceIdleDeadlineSeesProgress(t *testing.T) {
	for _, dir := range []string{"response", "request"} {
		t.Run(dir, func(t *testing.T) {
			eachLoopBackend(t, func(t *testing.T) {
				var up *rawUpstream
				if dir == "response" {
					up = endlessUpstream(t, make(chan error, 1))
				} else {
					up = bodyUpstream(t, nil)
				}
				p, addr := startProxy(t, nil, &exchange.Service{Upstream: up.addr()}, func(c *Config) {
					c.EventLoops, c.SpliceMin = 1, testSpliceMin
				})
				c := dialClient(t, addr)
				if dir == "response" {
					c.send("GET / HTTP/1.1\r\nHost: x\r\n\r\n")
					if _, err := io.ReadFull(c.br, make([]byte, 256<<10)); err != nil {
						t.Fatal(err)
					}
				} else {
					c.send("POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 1073741824\r\n\r\n")
					c.c.Write(spliceBody(1<<20, 7)) // then nothing more
				}
				splicing := func(lc *clientConn) bool {
					return lc != nil && lc.r != nil && lc.r.splicing && (lc.s.SpliceMoved() > 0 || lc.r.up.s.SpliceMoved() > 0)
				}
				testkit.WaitFor(t, "a splice moved bytes", func() bool {
					var ok bool
					p.lg.each(func(ls *loopState) { ok = splicing(ls.conns.head) })
					return ok
				})
				var first, second string
				p.lg.each(func(ls *loopState) {
					lc := ls.conns.head
					lc.r.splMark = 0 // as if the deadline was set before any byte moved
					lc.exchangeTimeout()
					if lc.state != lcExchange || !splicing(lc) {
						first = "a splice that moved bytes was cut"
						return
					}
					lc.exchangeTimeout()
					if lc.state == lcExchange && lc.r != nil && lc.r.splicing {
						second = "a splice that moved nothing since was not cut"
					}
				})
				if first != "" || second != "" {
					t.Fatal(first, second)
				}
			})
		})
	}
}

// bodyUpstream reads each request's Content-Length body and answers with
// its length and SHA-256; a request whose path starts with /early is
// answered 413 at once, without reading its body, and the connection
// closed.
func bodyUpstream(t *testing.T, got chan<- int) *rawUpstream {
	return newRawUpstream(t, func(_ int, c net.Conn) {
		br := bufio.NewReader(c)
		for {
			head, err := readRequestHead(br)
			if err != nil {
				return
			}
			if strings.HasPrefix(strings.Fields(head)[1], "/early") {
				io.WriteString(c, "HTTP/1.1 413 Payload Too Large\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
				lingeringClose(c)
				return
			}
			n, _ := strconv.Atoi(headerOf(head, "Content-Length"))
			h := sha256.New()
			k, err := io.CopyN(h, br, int64(n))
			if got != nil {
				got <- int(k)
			}
			if err != nil {
				return
			}
			sum := fmt.Sprintf("%d %x", k, h.Sum(nil))
			fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s", len(sum), sum)
		}
	})
}

// lingeringClose ends a connection the way an HTTP server that answered
// before reading the whole request body must (RFC 9112 section 9.6, nginx's
// lingering_close): it sends FIN, then reads and discards what the peer
// still sends, for at most 10 seconds and 256 MiB, before it closes. A
// plain close with unread bytes queued makes the kernel answer with RST,
// and an RST that reaches the proxy before it read the answer discards
// the answer from its receive queue: the proxy could then relay only a
// 502, whatever it does.
func lingeringClose(c net.Conn) {
	c.(*net.TCPConn).CloseWrite()
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	io.Copy(io.Discard, io.LimitReader(c, 256<<20))
}

func sumOf(b []byte) string { return fmt.Sprintf("%d %x", len(b), sha256.Sum256(b)) }

// Large request bodies go to the upstream by splice, byte for byte; the
// bytes after one (a pipelined request) stay for the next request; small
// bodies are copied.
func TestSpliceRequestBodies(t *testing.T) {
	eachLoopBackend(t, func(t *testing.T) {
		up := bodyUpstream(t, nil)
		hook := newTestHook(nil)
		p, addr := startProxy(t, hook, &exchange.Service{Upstream: up.addr()}, func(c *Config) {
			c.EventLoops, c.SpliceMin = 1, testSpliceMin
		})
		c := dialClient(t, addr)
		big, small := spliceBody(3<<20+5, 3), spliceBody(1000, 4)
		var w bytes.Buffer
		for _, b := range [][]byte{big, small, big} {
			fmt.Fprintf(&w, "POST /up HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s", len(b), b)
		}
		go c.c.Write(w.Bytes()) // pipelined: the bytes after a body are the next request
		for i, b := range [][]byte{big, small, big} {
			r, got := c.resp("POST")
			if r.StatusCode != 200 || got != sumOf(b) {
				t.Fatalf("request %d: status %d, upstream got %q, want %q", i, r.StatusCode, got, sumOf(b))
			}
			if d := hook.waitDone(t); d.bytesIn != int64(len(b)) || d.clientAborted {
				t.Fatalf("request %d: done %+v", i, d)
			}
		}
		// Not spliced: per body, the read that brought the head and what
		// io_uring's recv took before its cancel (at most 4 x 16 KiB).
		if st := p.Stats(); st.Loops.Spliced < 2*(3<<20)-(256<<10) || st.UpstreamDiscarded != 0 {
			t.Fatalf("stats %+v: want both large bodies mostly spliced", st)
		}
	})
}

// A client that ends (FIN) or resets in the middle of a spliced body:
// the exchange is aborted, the upstream gets its connection closed with
// the body short, and nothing stays on the proxy.
func TestSpliceRequestBodyClientGone(t *testing.T) {
	for _, how := range []string{"fin", "reset"} {
		t.Run(how, func(t *testing.T) {
			eachLoopBackend(t, func(t *testing.T) {
				got := make(chan int, 1)
				up := bodyUpstream(t, got)
				hook := newTestHook(nil)
				p, addr := startProxy(t, hook, &exchange.Service{Upstream: up.addr()}, func(c *Config) {
					c.EventLoops, c.SpliceMin = 1, testSpliceMin
				})
				c := dialClient(t, addr)
				fmt.Fprintf(c.c, "POST /up HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n", 8<<20)
				c.c.Write(spliceBody(1<<20, 5))
				testkit.WaitFor(t, "the body's splice moved bytes", func() bool { return p.Stats().Loops.Spliced > 0 })
				if how == "fin" {
					c.c.(*net.TCPConn).CloseWrite()
				} else {
					c.c.(*net.TCPConn).SetLinger(0)
					c.c.Close()
				}
				select {
				case n := <-got:
					if n >= 8<<20 {
						t.Fatalf("the upstream got the whole body (%d bytes)", n)
					}
				case <-time.After(testkit.WaitBound):
					t.Fatal("the upstream's read never ended")
				}
				if d := hook.waitDone(t); !d.clientAborted || d.bytesIn >= 8<<20 {
					t.Fatalf("done %+v: want a client abort", d)
				}
				testkit.WaitFor(t, "the proxy holds no connection", func() bool {
					st := p.Stats()
					return st.Conns == 0 && st.Loops.Sockets == 0 && st.Loops.Pipes <= 16
				})
			})
		})
	}
}

// An upstream that answers before reading a large body and closes: the
// client gets that answer and the connection's end, never a hang.
func TestSpliceRequestBodyEarlyAnswer(t *testing.T) {
	eachLoopBackend(t, func(t *testing.T) {
		up := bodyUpstream(t, nil)
		p, addr := startProxy(t, nil, &exchange.Service{Upstream: up.addr()}, func(c *Config) {
			c.EventLoops, c.SpliceMin = 1, testSpliceMin
		})
		c := dialClient(t, addr)
		go func() {
			fmt.Fprintf(c.c, "POST /early HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n", 64<<20)
			for b := spliceBody(1<<20, 6); ; {
				if _, err := c.c.Write(b); err != nil {
					return // the proxy closed (or reset) the connection
				}
			}
		}()
		r, err := http.ReadResponse(c.br, nil)
		if err != nil || r.StatusCode != 413 {
			t.Fatalf("%v %v: want the upstream's 413", r, err)
		}
		c.c.(*net.TCPConn).CloseWrite()
		testkit.WaitFor(t, "the proxy holds no connection", func() bool {
			st := p.Stats()
			return st.Conns == 0 && st.Loops.Sockets == 0
		})
	})
}
