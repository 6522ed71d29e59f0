package proxy

import (
	"bufio"
	"io"
	"net"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/rl-tproxy/rl-tproxy/internal/testkit"
	"github.com/rl-tproxy/rl-tproxy/pkg/exchange"
	"github.com/rl-tproxy/rl-tproxy/pkg/httpparse"
)

// The lcUpgrading state: a 101 was relayed and the connection waits for
// the bytes queued on both sides to reach the kernel before both sockets
// are detached to the tunnel goroutine (loophand.go). Only a side that
// does not take its bytes keeps it there; these tests bring a connection
// into it over real sockets, check that what it holds is bounded, and
// that it is released when the stalled peer vanishes or the tunnel idle
// bound passes.

// upgradingLong is a tunnel idle bound the tests never reach: a release
// they wait for comes from what the test did, not from this timer.
const upgradingLong = time.Hour

// connProbe is what these tests see of the one client connection.
type connProbe struct {
	conns              int
	state              uint8
	cPending, uPending int // bytes queued for the client, for the upstream
	buffered           int // client bytes held
	cPaused, uPaused   bool
}

// probeConn reads the state of p's client connection on its loop.
func probeConn(p *Proxy) connProbe {
	var st connProbe
	p.lg.each(func(ls *loopState) {
		for c := ls.conns.head; c != nil; c = c.next {
			st.conns++
			st.state, st.cPaused = c.state, c.paused
			if c.s != nil {
				st.cPending = c.s.Pending()
			}
			if c.buf.b != nil {
				st.buffered = c.buf.w - c.buf.r
			}
			var u *upstreamConn
			if c.tun != nil {
				u = c.tun.u
			} else if c.r != nil {
				u = c.r.up
			}
			if u != nil && u.s != nil {
				st.uPending, st.uPaused = u.s.Pending(), u.paused
			}
		}
	})
	return st
}

// fireTimer makes the client connection's deadline pass now: what its
// timer does once the tunnel idle bound has passed.
func fireTimer(p *Proxy) {
	p.lg.each(func(ls *loopState) {
		for c := ls.conns.head; c != nil; c = c.next {
			if c.state == lcUpgrading {
				c.deadline = ls.l.Now()
				c.onTimer()
				return
			}
		}
	})
}

// rstClose closes c with an RST (SO_LINGER 0): the peer vanishes.
func rstClose(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		tc.SetLinger(0)
	}
	c.Close()
}

// upgradingEnd is how a connection held in lcUpgrading ends.
type upgradingEnd int

const (
	endIdle           upgradingEnd = iota // the tunnel idle bound passes
	endIdleTimer                          // the same, by the real timer of a short bound
	endClientVanishes                     // the client resets
	endUpstreamVanish                     // the upstream resets
)

var upgradingEnds = []struct {
	name string
	end  upgradingEnd
}{{"idle-bound", endIdle}, {"idle-timer", endIdleTimer}, {"client-vanishes", endClientVanishes}, {"upstream-vanishes", endUpstreamVanish}}

// tunnelIdleFor is the tunnel idle bound of a test ending with end.
func tunnelIdleFor(end upgradingEnd) time.Duration {
	if end == endIdleTimer {
		return 100 * time.Millisecond
	}
	return upgradingLong
}

// reachUpgrading waits for p's connection to wait in lcUpgrading and
// returns what it holds there. A short real idle bound may end that wait
// before a probe sees it: then the Done checks show it was reached.
func reachUpgrading(t *testing.T, p *Proxy, end upgradingEnd) (connProbe, bool) {
	t.Helper()
	if end == endIdleTimer {
		return connProbe{}, false
	}
	testkit.WaitFor(t, "the 101 to bring the connection into lcUpgrading", func() bool {
		return probeConn(p).state == lcUpgrading
	})
	return probeConn(p), true
}

// An Upgrade request with a body the upstream never reads: the upstream
// answers 101 while the proxy holds body bytes it could not write to it.
// The connection waits in lcUpgrading with the upstream's queue bounded
// (reading the client paused above loopMaxPending) and is released at
// the tunnel idle bound or as soon as either peer vanishes.
func TestUpgradingUpstreamTakesNothing(t *testing.T) {
	eachLoopBackend(t, func(t *testing.T) {
		for _, tc := range upgradingEnds {
			t.Run(tc.name, func(t *testing.T) { upstreamTakesNothing(t, tc.end) })
		}
	})
}

func upstreamTakesNothing(t *testing.T, end upgradingEnd) {
	send101, vanish, stop := make(chan struct{}), make(chan struct{}), make(chan struct{})
	upGone := make(chan error, 1)
	up := newRawUpstream(t, func(_ int, c net.Conn) {
		if _, err := readRequestHead(bufio.NewReader(c)); err != nil {
			return
		}
		if !waitChan(send101, stop) {
			return
		}
		io.WriteString(c, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n")
		select {
		case <-vanish:
			rstClose(c)
		case <-stop:
			// the proxy closed its side (or the test failed): what it had
			// written, then the end, arrive within the bound
			c.SetReadDeadline(time.Now().Add(testkit.WaitBound))
			_, err := io.Copy(io.Discard, c)
			upGone <- err
		}
	})
	t.Cleanup(func() { closeOnce(stop) }) // before up's cleanup waits for the handler
	hook := newTestHook(nil)
	p, addr := startProxy(t, hook, &exchange.Service{Upstream: up.addr()}, func(c *Config) {
		c.EventLoops = 1
		c.TunnelIdleTimeout = tunnelIdleFor(end)
	})
	nc := dialSmallRcvbuf(t, addr)
	io.WriteString(nc, "POST /ws HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nContent-Length: 1073741824\r\n\r\n")
	var sent atomic.Int64
	go func() { // the body, until the connection ends
		b := make([]byte, 64<<10)
		for {
			n, err := nc.Write(b)
			sent.Add(int64(n))
			if err != nil {
				return
			}
		}
	}()
	testkit.WaitFor(t, "the proxy to hold body bytes the upstream does not take", func() bool {
		st := probeConn(p)
		return st.state == lcExchange && st.uPending > 0 && st.cPaused
	})
	close(send101)
	if st, ok := reachUpgrading(t, p, end); ok {
		if st.uPending == 0 || !st.cPaused || !st.uPaused {
			t.Fatalf("in lcUpgrading: %+v, want bytes queued for the upstream and both sides paused", st)
		}
		if st.uPending > loopMaxPending+loopReadSize || st.buffered > bufSize {
			t.Fatalf("unbounded: %+v (limits %d queued, %d buffered)", st, loopMaxPending+loopReadSize, bufSize)
		}
		t.Logf("lcUpgrading holds %d bytes for the upstream, %d buffered (client sent %d)", st.uPending, st.buffered, sent.Load())
	}
	d := endUpgrading(t, end, p, nc, vanish, hook)
	switch {
	case end == endClientVanishes && !d.clientAborted:
		t.Fatalf("Done %+v: want a client abort", d)
	case (end == endIdle || end == endIdleTimer) && (d.clientAborted || !isTimeout(d.upstreamErr) || !strings.Contains(d.upstreamErr.Error(), "write to upgraded upstream")):
		t.Fatalf("Done %+v: want the upstream's write timeout", d)
	case end == endUpstreamVanish && (d.clientAborted || d.upstreamErr == nil || !strings.Contains(d.upstreamErr.Error(), "upgraded upstream")):
		t.Fatalf("Done %+v: want the upstream's failure", d)
	}
	testkit.WaitFor(t, "the connection to be released", func() bool { return probeConn(p).conns == 0 })
	if end != endUpstreamVanish {
		closeOnce(stop)
		if err := recvWithin(t, upGone, "the upstream connection to end"); err != nil && !isReset(err) {
			t.Fatalf("upstream connection: %v, want it closed", err)
		}
	}
}

// An upstream that answers 1xx, then 101 and tunnel bytes to a client
// that reads nothing, through a small proxy send buffer (so that what the
// kernel takes is less than loopMaxPending and the upstream is never
// paused before the 101): the 101 stays queued, and the connection waits
// in lcUpgrading with the client's queue bounded by what one upstream
// response held, until the idle bound or either peer vanishes.
func TestUpgradingClientTakesNothing(t *testing.T) {
	eachLoopBackend(t, func(t *testing.T) {
		for _, tc := range upgradingEnds {
			t.Run(tc.name, func(t *testing.T) { clientTakesNothing(t, tc.end) })
		}
	})
}

func clientTakesNothing(t *testing.T, end upgradingEnd) {
	interim := "HTTP/1.1 102 Processing\r\nX-Pad: " + strings.Repeat("p", httpparse.MaxInterimBytes/httpparse.MaxInterims-40) + "\r\n\r\n"
	const interims = httpparse.MaxInterims // just under httpparse.MaxInterimBytes: as much as the proxy relays, above the small buffers
	answer, vanish, stop := make(chan struct{}), make(chan struct{}), make(chan struct{})
	upGone := make(chan error, 1)
	up := newRawUpstream(t, func(_ int, c net.Conn) {
		if _, err := readRequestHead(bufio.NewReader(c)); err != nil {
			return
		}
		if !waitChan(answer, stop) {
			return
		}
		resp := strings.Repeat(interim, interims) + "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n" +
			strings.Repeat("t", 64<<10)
		c.SetWriteDeadline(time.Now().Add(testkit.WaitBound))
		if _, err := io.WriteString(c, resp); err != nil {
			return
		}
		select {
		case <-vanish:
			rstClose(c)
		case <-stop:
			c.SetReadDeadline(time.Now().Add(testkit.WaitBound))
			_, err := io.Copy(io.Discard, c)
			upGone <- err
		}
	})
	t.Cleanup(func() { closeOnce(stop) })
	hook := newTestHook(nil)
	p, addr := startProxy(t, hook, &exchange.Service{Upstream: up.addr()}, func(c *Config) {
		c.EventLoops = 1
		c.TunnelIdleTimeout = tunnelIdleFor(end)
	})
	nc := dialSmallRcvbuf(t, addr)
	io.WriteString(nc, "GET /ws HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n")
	testkit.WaitFor(t, "the request to reach the upstream", func() bool { return probeConn(p).state == lcExchange })
	smallSendBuffer(t, p)
	close(answer)
	if st, ok := reachUpgrading(t, p, end); ok {
		if st.cPending == 0 || !st.cPaused || !st.uPaused {
			t.Fatalf("in lcUpgrading: %+v, want bytes queued for the client and both sides paused", st)
		}
		if limit := interims*len(interim) + 256 + loopReadSize; st.cPending > limit || st.uPending != 0 {
			t.Fatalf("unbounded: %+v (limit %d queued for the client)", st, limit)
		}
		t.Logf("lcUpgrading holds %d bytes for the client", st.cPending)
	}
	d := endUpgrading(t, end, p, nc, vanish, hook)
	switch {
	case end != endUpstreamVanish && !d.clientAborted:
		t.Fatalf("Done %+v: want a client abort (it took nothing, or left)", d)
	case end == endUpstreamVanish && (d.clientAborted || d.upstreamErr == nil || !strings.Contains(d.upstreamErr.Error(), "upgraded upstream")):
		t.Fatalf("Done %+v: want the upstream's failure", d)
	}
	testkit.WaitFor(t, "the connection to be released", func() bool { return probeConn(p).conns == 0 })
	if end != endUpstreamVanish {
		closeOnce(stop)
		if err := recvWithin(t, upGone, "the upstream connection to end"); err != nil && !isReset(err) {
			t.Fatalf("upstream connection: %v, want it closed", err)
		}
	}
}

// smallSendBuffer shrinks the send buffer of p's client connection (the
// kernel then takes a few KiB for it, not the megabytes loopback
// autotuning allows).
func smallSendBuffer(t *testing.T, p *Proxy) {
	t.Helper()
	var err error
	p.lg.each(func(ls *loopState) {
		for c := ls.conns.head; c != nil; c = c.next {
			if c.s != nil {
				err = syscall.SetsockoptInt(c.s.FD(), syscall.SOL_SOCKET, syscall.SO_SNDBUF, 4096)
			}
		}
	})
	if err != nil {
		t.Fatalf("SO_SNDBUF: %v", err)
	}
}

// waitChan waits for ch, or stop, or the test bound; it reports ch.
func waitChan(ch, stop <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	case <-stop:
	case <-time.After(testkit.WaitBound):
	}
	return false
}

func closeOnce(ch chan struct{}) {
	select {
	case <-ch:
	default:
		close(ch)
	}
}

// endUpgrading ends a stalled lcUpgrading connection the way end says
// (the idle timer fired at once, the client reset, the upstream gone; a
// real idle timer needs nothing) and returns its Done record, which must
// be the 101's.
func endUpgrading(t *testing.T, end upgradingEnd, p *Proxy, nc net.Conn, vanish chan struct{}, hook *testHook) doneRec {
	t.Helper()
	switch end {
	case endIdle:
		fireTimer(p)
	case endClientVanishes:
		rstClose(nc)
	case endUpstreamVanish:
		close(vanish)
	}
	d := hook.waitDone(t)
	if d.status != 101 {
		t.Fatalf("Done status %d, want 101", d.status)
	}
	return d
}
