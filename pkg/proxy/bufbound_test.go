package proxy

import (
	"bufio"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/rl-tproxy/rl-tproxy/internal/testkit"
	"github.com/rl-tproxy/rl-tproxy/pkg/evloop"
	"github.com/rl-tproxy/rl-tproxy/pkg/exchange"
	"github.com/rl-tproxy/rl-tproxy/pkg/httpparse"
)

// eachLoopBackend runs fn once per evloop backend, the proxy's loops
// forced onto it.
func eachLoopBackend(t *testing.T, fn func(t *testing.T)) {
	for _, be := range []evloop.Backend{evloop.Epoll, evloop.IOUring} {
		t.Run(be.String(), func(t *testing.T) {
			if be == evloop.IOUring {
				g, err := evloop.Start(evloop.Config{Loops: 1, Backend: be, Logger: slog.New(slog.DiscardHandler)})
				if err != nil {
					testkit.Missing(t, "io_uring refused on this machine: %v", err)
				}
				g.Close()
			}
			loopBackend = be
			// A cleanup registered before fn's runs after theirs, once
			// the proxy fn started has stopped reading loopBackend.
			t.Cleanup(func() { loopBackend = evloop.Auto })
			fn(t)
		})
	}
}

// clientState is what a test checks of a client connection on a loop.
type clientState struct {
	conns    int  // client connections on the loops
	paused   bool // reading paused (the last one found)
	buffered int  // bytes held in its buffer
	pending  int  // response bytes queued for it
	upPaused bool // its upstream's reading paused (backpressure)
}

// clients inspects p's client connections on their loops.
func clients(p *Proxy) clientState {
	var st clientState
	p.lg.each(func(ls *loopState) {
		for c := ls.conns.head; c != nil; c = c.next {
			st.conns++
			st.paused = c.paused
			if c.buf.b != nil {
				st.buffered = c.buf.w - c.buf.r
			}
			if c.s != nil {
				st.pending = c.s.Pending()
			}
			st.upPaused = c.r != nil && c.r.up != nil && c.r.up.paused
		}
	})
	return st
}

// numberedUpstream answers every request with its path (5 bytes after
// the slash) as the body; the first answer waits for release.
func numberedUpstream(t *testing.T, release <-chan struct{}) *rawUpstream {
	return newRawUpstream(t, func(_ int, c net.Conn) {
		br := bufio.NewReader(c)
		bw := bufio.NewWriter(c)
		for first := true; ; first = false {
			head, err := readRequestHead(br)
			if err != nil {
				return
			}
			if first && release != nil {
				select {
				case <-release:
				case <-time.After(testkit.WaitBound):
					return
				}
			}
			path := strings.Fields(head)[1]
			fmt.Fprintf(bw, "HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s", len(path)-1, path[1:])
			if br.Buffered() == 0 && bw.Flush() != nil {
				return
			}
		}
	})
}

// TestPipelineBurstBehindSlowResponse: 1,700 small GETs pipelined in one
// write while the first response waits: the proxy fills its buffer and
// pauses the client; once the first answer comes, every request is
// answered, in order, and the connection survives (it was reset when a
// read came back into a buffer without room for it).
func TestPipelineBurstBehindSlowResponse(t *testing.T) {
	eachLoopBackend(t, func(t *testing.T) {
		release := make(chan struct{})
		up := numberedUpstream(t, release)
		p, addr := startProxy(t, nil, &exchange.Service{Upstream: up.addr()}, func(c *Config) { c.EventLoops = 1 })
		cl := dialClient(t, addr)
		const n = 1700
		var sb strings.Builder
		pad := strings.Repeat("a", 200)
		for i := 0; i < n; i++ {
			fmt.Fprintf(&sb, "GET /%05d HTTP/1.1\r\nHost: x\r\nX-Pad: %s\r\n\r\n", i, pad)
		}
		werr := make(chan error, 1)
		go func() { _, err := io.WriteString(cl.c, sb.String()); werr <- err }()
		testkit.WaitFor(t, "the proxy pauses the pipelining client", func() bool { return clients(p).paused })
		if st := clients(p); st.buffered > bufSize {
			t.Fatalf("%d request bytes buffered, more than the %d-byte buffer", st.buffered, bufSize)
		}
		close(release)
		for i := 0; i < n; i++ {
			r, body := cl.resp("GET")
			if r.StatusCode != 200 || body != fmt.Sprintf("%05d", i) {
				t.Fatalf("response %d of %d: %d %q", i+1, n, r.StatusCode, body)
			}
		}
		if err := <-werr; err != nil {
			t.Fatal(err)
		}
	})
}

// TestPipeliningClientNotReadingIsPaused: a client that pipelines
// requests and never reads the answers is paused once its buffer and
// its queued answer are full; what the proxy holds for it stays bounded.
func TestPipeliningClientNotReadingIsPaused(t *testing.T) {
	eachLoopBackend(t, func(t *testing.T) {
		body := strings.Repeat("b", 64<<10)
		var served atomic.Int64
		up := newRawUpstream(t, func(_ int, c net.Conn) {
			br := bufio.NewReader(c)
			for {
				if _, err := readRequestHead(br); err != nil {
					return
				}
				served.Add(1)
				if _, err := io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 65536\r\n\r\n"+body); err != nil {
					return
				}
			}
		})
		p, addr := startProxy(t, nil, &exchange.Service{Upstream: up.addr()}, func(c *Config) { c.EventLoops = 1 })
		nc := dialSmallRcvbuf(t, addr)
		var sent atomic.Int64
		stop := make(chan struct{})
		done := make(chan struct{})
		go func() { // writes until the test ends; never reads
			defer close(done)
			req := []byte("GET /x HTTP/1.1\r\nHost: x\r\n\r\n")
			for {
				select {
				case <-stop:
					return
				default:
				}
				if _, err := nc.Write(req); err != nil {
					return
				}
				sent.Add(1)
			}
		}()
		defer func() { close(stop); nc.Close(); <-done }()
		// Until the proxy has taken the connection, no connection is
		// not a cut client: wait for a request to reach the upstream.
		testkit.WaitFor(t, "the upstream gets a request", func() bool { return served.Load() > 0 })
		testkit.WaitFor(t, "the proxy pauses the client that does not read", func() bool {
			st := clients(p)
			return st.conns == 0 || st.paused && st.pending > 0
		})
		st := clients(p)
		if st.conns != 1 {
			t.Fatalf("%d client connections, want 1 (the client was cut)", st.conns)
		}
		if st.buffered > bufSize || st.pending > loopMaxPending+len(body)+loopReadSize {
			t.Fatalf("unbounded: %d request bytes buffered, %d answer bytes queued", st.buffered, st.pending)
		}
		t.Logf("paused after %d requests sent: %d bytes buffered, %d queued", sent.Load(), st.buffered, st.pending)
	})
}

// dialSmallRcvbuf connects with a 16 KiB receive buffer, so that what
// the client does not read backs up into the proxy quickly.
func dialSmallRcvbuf(t *testing.T, addr string) net.Conn {
	t.Helper()
	d := net.Dialer{Control: func(_, _ string, rc syscall.RawConn) error {
		return rc.Control(func(fd uintptr) { syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 16<<10) })
	}}
	nc, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	nc.SetDeadline(time.Now().Add(testkit.WaitBound))
	t.Cleanup(func() { nc.Close() })
	return nc
}

// TestChunkedResponseBigExtensionsSlowClient: a large chunked response
// whose size lines carry 3,000-byte extensions, relayed to a client that
// reads only while the upstream is paused for backpressure: it arrives
// complete (it was cut, "response head too large", when a resumed
// upstream's read did not fit behind a held partial size line).
func TestChunkedResponseBigExtensionsSlowClient(t *testing.T) {
	eachLoopBackend(t, func(t *testing.T) {
		chunk := strings.Repeat("x", 4000)
		ext := ";e=" + strings.Repeat("v", 3000)
		const nChunks = 3000
		var upDone atomic.Bool
		up := newRawUpstream(t, func(_ int, c net.Conn) {
			br := bufio.NewReader(c)
			if _, err := readRequestHead(br); err != nil {
				return
			}
			bw := bufio.NewWriterSize(c, 64<<10)
			io.WriteString(bw, "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
			for i := 0; i < nChunks; i++ {
				fmt.Fprintf(bw, "%x%s\r\n%s\r\n", len(chunk), ext, chunk)
			}
			io.WriteString(bw, "0\r\n\r\n")
			bw.Flush()
			upDone.Store(true)
			io.Copy(io.Discard, br)
		})
		p, addr := startProxy(t, nil, &exchange.Service{Upstream: up.addr()}, func(c *Config) { c.EventLoops = 1 })
		nc := dialSmallRcvbuf(t, addr)
		br := bufio.NewReaderSize(nc, 4096)
		io.WriteString(nc, "GET /big HTTP/1.1\r\nHost: x\r\n\r\n")
		waitBackpressure := func() {
			testkit.WaitFor(t, "the upstream paused for the slow client", func() bool {
				return upDone.Load() || clients(p).upPaused
			})
		}
		waitBackpressure()
		r, err := http.ReadResponse(br, &http.Request{Method: "GET"})
		if err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, 4096)
		total, pauses := 0, 1
		for {
			n, err := r.Body.Read(buf)
			total += n
			if err == io.EOF {
				break
			}
			if err != nil {
				t.Fatalf("after %d of %d body bytes: %v", total, nChunks*len(chunk), err)
			}
			if total/(512<<10) >= pauses { // read in bursts, each after a backpressure pause
				waitBackpressure()
				pauses++
			}
		}
		if total != nChunks*len(chunk) {
			t.Fatalf("body %d bytes, want %d", total, nChunks*len(chunk))
		}
	})
}

// TestLargeHeadAfterPartialRead: with limits beyond the default buffer, a
// head whose first 50 KiB wait in the buffer when a full read arrives
// (the rest of the head and a pipelined request) is served: the buffer
// keeps room for a full read behind a partial head (a read that did not
// fit answered 431).
func TestLargeHeadAfterPartialRead(t *testing.T) {
	eachLoopBackend(t, func(t *testing.T) {
		up := numberedUpstream(t, nil)
		svc := &exchange.Service{Upstream: up.addr(), Limits: httpparse.Limits{MaxHeaderBytes: 64 << 10}}
		p, addr := startProxy(t, nil, svc, func(c *Config) { c.EventLoops = 1 })
		cl := dialClient(t, addr)
		head := "GET /00001 HTTP/1.1\r\nHost: x\r\n"
		for len(head) < 60<<10 {
			head += "X-Pad: " + strings.Repeat("p", 1000) + "\r\n"
		}
		head += "\r\n"
		const first = 50 << 10
		cl.send(head[:first])
		testkit.WaitFor(t, "the proxy buffered the first part of the head", func() bool { return clients(p).buffered == first })
		cl.send(head[first:] + "GET /00002 HTTP/1.1\r\nHost: x\r\nX-Pad: " + strings.Repeat("q", 12<<10) + "\r\n\r\n")
		for i := 1; i <= 2; i++ {
			r, body := cl.resp("GET")
			if r.StatusCode != 200 || body != fmt.Sprintf("%05d", i) {
				t.Fatalf("response %d: %d %q", i, r.StatusCode, body)
			}
		}
	})
}

// TestUpstreamReadBeyondHeldLine: a partial chunk-size line is held when
// the upstream's next read is larger than the buffer's free part (48 KiB
// here, handed to OnRead directly: the evloop delivers at most
// loopReadSize, this checks the proxy does not depend on it for
// correctness): the body is relayed whole, not cut as "response head too
// large".
func TestUpstreamReadBeyondHeldLine(t *testing.T) {
	eachLoopBackend(t, func(t *testing.T) {
		ext := ";e=" + strings.Repeat("v", 3000)
		data := strings.Repeat("d", 48<<10)
		line := fmt.Sprintf("%x%s\r\n", len(data), ext)
		release := make(chan struct{})
		up := newRawUpstream(t, func(_ int, c net.Conn) {
			br := bufio.NewReader(c)
			if _, err := readRequestHead(br); err != nil {
				return
			}
			io.WriteString(c, "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"+line[:1000])
			select { // the rest comes through the injected read
			case <-release:
			case <-time.After(testkit.WaitBound):
			}
			io.Copy(io.Discard, br)
		})
		defer close(release)
		p, addr := startProxy(t, nil, &exchange.Service{Upstream: up.addr()}, func(c *Config) { c.EventLoops = 1 })
		cl := dialClient(t, addr)
		cl.send("GET /big HTTP/1.1\r\nHost: x\r\n\r\n")
		r, err := http.ReadResponse(cl.br, &http.Request{Method: "GET"})
		if err != nil {
			t.Fatal(err)
		}
		held := func() (n int) {
			p.lg.each(func(ls *loopState) {
				for c := ls.conns.head; c != nil; c = c.next {
					if c.r != nil && c.r.up != nil {
						n = c.r.up.buf.w - c.r.up.buf.r
					}
				}
			})
			return n
		}
		testkit.WaitFor(t, "the proxy holds the partial size line", func() bool { return held() == 1000 })
		rest := []byte(line[1000:] + data + "\r\n0\r\n\r\n")
		p.lg.each(func(ls *loopState) {
			for c := ls.conns.head; c != nil; c = c.next {
				if c.r != nil && c.r.up != nil {
					c.r.up.OnRead(c.r.up.s, rest)
				}
			}
		})
		b, err := io.ReadAll(r.Body)
		if err != nil || string(b) != data {
			t.Fatalf("body: %d bytes (want %d), %v", len(b), len(data), err)
		}
	})
}

// TestEndlessInterimToNonReadingClient: an upstream that answers with
// 1xx responses without end, to a client that never reads: the proxy
// relays httpparse.MaxInterims of them, then ends the exchange (502) and closes
// both connections, so what it holds stays bounded.
func TestEndlessInterimToNonReadingClient(t *testing.T) {
	eachLoopBackend(t, func(t *testing.T) {
		interim := "HTTP/1.1 102 Processing\r\nX-Pad: " + strings.Repeat("p", 4000) + "\r\n\r\n"
		var wrote atomic.Int64
		upEnd := make(chan error, 1)
		up := newRawUpstream(t, func(_ int, c net.Conn) {
			if _, err := readRequestHead(bufio.NewReader(c)); err != nil {
				return
			}
			wrote.Store(1)
			c.SetWriteDeadline(time.Now().Add(testkit.WaitBound))
			for {
				if _, err := io.WriteString(c, interim); err != nil {
					upEnd <- err
					return
				}
				wrote.Add(int64(len(interim)))
			}
		})
		p, addr := startProxy(t, nil, &exchange.Service{Upstream: up.addr()}, func(c *Config) { c.EventLoops = 1 })
		nc := dialSmallRcvbuf(t, addr)
		if _, err := io.WriteString(nc, "GET /x HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
			t.Fatal(err)
		}
		testkit.WaitFor(t, "the upstream gets the request", func() bool { return wrote.Load() > 0 })
		testkit.WaitFor(t, "the proxy ends the exchange", func() bool { return clients(p).conns == 0 })
		if err := recvWithin(t, upEnd, "the upstream connection to be closed"); err == nil || isTimeout(err) {
			t.Fatalf("upstream writes ended with %v, want the proxy's close", err)
		}
		t.Logf("the upstream wrote %d bytes before the proxy closed it", wrote.Load())
	})
}
