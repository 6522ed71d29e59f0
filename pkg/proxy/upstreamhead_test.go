package proxy

import (
	"bufio"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/rl-tproxy/rl-tproxy/pkg/exchange"
	"github.com/rl-tproxy/rl-tproxy/pkg/httpparse"
)

// slowHead is a response head of 2,000 bytes: written a byte every 5ms,
// it takes ten seconds, fifty times the upstream timeout of the test.
var slowHead = "HTTP/1.1 200 OK\r\nX-Pad: " + strings.Repeat("a", 2000-len("HTTP/1.1 200 OK\r\nX-Pad: \r\nContent-Length: 2\r\n\r\n")) + "\r\nContent-Length: 2\r\n\r\n"

// An upstream that sends its response head one byte at a time is cut at
// the upstream timeout, counted from the request being sent: reads of a
// partial head do not renew the deadline (the idle timeout, far longer,
// governs only the body).
func TestUpstreamHeadDribbleCut(t *testing.T) {
	gone := make(chan struct{})
	up := newRawUpstream(t, func(_ int, c net.Conn) {
		defer close(gone)
		if _, err := readRequestHead(bufio.NewReader(c)); err != nil {
			return
		}
		tick := time.NewTicker(5 * time.Millisecond) // the simulated slow upstream
		defer tick.Stop()
		for i := 0; i < len(slowHead); i++ {
			if _, err := io.WriteString(c, slowHead[i:i+1]); err != nil {
				return // the proxy gave up
			}
			<-tick.C
		}
		io.WriteString(c, "ok")
	})
	hook := newTestHook(nil)
	_, addr := startProxy(t, hook, &exchange.Service{Upstream: up.addr(), UpstreamTimeout: 200 * time.Millisecond, IdleTimeout: time.Minute}, nil)
	c := dialClient(t, addr)
	c.send("GET / HTTP/1.1\r\nHost: x\r\n\r\n")
	if r, _ := c.resp("GET"); r.StatusCode != 504 {
		t.Fatalf("status %d, want 504 (the head did not come within the upstream timeout)", r.StatusCode)
	}
	d := hook.waitDone(t)
	if d.status != 504 || d.upstreamErr == nil || !isTimeout(d.upstreamErr) {
		t.Fatalf("Done: status %d, upstream error %v; want 504 and a timeout", d.status, d.upstreamErr)
	}
	<-gone // the upstream connection was closed, not left dribbling
}

// readAllFrom reads what the proxy sends until it closes the connection.
func readAllFrom(t *testing.T, c *client) string {
	t.Helper()
	b, err := io.ReadAll(c.br)
	if err != nil && !isReset(err) {
		t.Fatalf("read: %v", err)
	}
	return string(b)
}

const earlyHints = "HTTP/1.1 103 Early Hints\r\nLink: </s.css>; rel=preload\r\n\r\n"

// An upstream that sends interim responses without end is cut after
// httpparse.MaxInterims of them (502): the client gets those, then the 502, and
// bytes_out counts every byte it got.
func TestUpstreamInterimFloodCut(t *testing.T) {
	sent := make(chan int, 1)
	up := newRawUpstream(t, func(_ int, c net.Conn) {
		if _, err := readRequestHead(bufio.NewReader(c)); err != nil {
			return
		}
		n := 0
		for ; n < 100000; n++ { // "forever": the proxy must stop reading long before
			if _, err := io.WriteString(c, earlyHints); err != nil {
				break
			}
		}
		sent <- n
	})
	hook := newTestHook(nil)
	_, addr := startProxy(t, hook, &exchange.Service{Upstream: up.addr()}, nil)
	c := dialClient(t, addr)
	c.send("GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
	got := readAllFrom(t, c)
	if n := strings.Count(got, "HTTP/1.1 103 "); n != httpparse.MaxInterims {
		t.Fatalf("the client got %d interim responses, want %d", n, httpparse.MaxInterims)
	}
	if i := strings.LastIndex(got, "HTTP/1.1 "); !strings.HasPrefix(got[i:], "HTTP/1.1 502 ") {
		t.Fatalf("final answer %q, want 502", got[i:min(len(got), i+40)])
	}
	d := hook.waitDone(t)
	if d.status != 502 || d.upstreamErr == nil || !strings.Contains(d.upstreamErr.Error(), "interim") {
		t.Fatalf("Done: status %d, upstream error %v", d.status, d.upstreamErr)
	}
	if d.bytesOut != int64(len(got)) {
		t.Fatalf("bytes_out %d, the client got %d bytes", d.bytesOut, len(got))
	}
	if n := <-sent; n >= 100000 {
		t.Fatalf("the upstream wrote all %d interim responses: the proxy kept reading", n)
	}
}

// Interim response bytes the client got count in bytes_out, with the
// final response.
func TestInterimBytesCounted(t *testing.T) {
	up := newRawUpstream(t, func(_ int, c net.Conn) {
		if _, err := readRequestHead(bufio.NewReader(c)); err != nil {
			return
		}
		io.WriteString(c, earlyHints+earlyHints+"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
	})
	hook := newTestHook(nil)
	_, addr := startProxy(t, hook, &exchange.Service{Upstream: up.addr()}, nil)
	c := dialClient(t, addr)
	c.send("GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
	got := readAllFrom(t, c)
	if strings.Count(got, "HTTP/1.1 103 ") != 2 || !strings.HasSuffix(got, "\r\n\r\nok") {
		t.Fatalf("client got %q", got)
	}
	d := hook.waitDone(t)
	if d.status != 200 || d.bytesOut != int64(len(got)) {
		t.Fatalf("Done: status %d, bytes_out %d; the client got %d bytes", d.status, d.bytesOut, len(got))
	}
}
