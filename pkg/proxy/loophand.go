package proxy

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/rl-tproxy/rl-tproxy/pkg/evloop"
	"github.com/rl-tproxy/rl-tproxy/pkg/exchange"
	"github.com/rl-tproxy/rl-tproxy/pkg/proxyproto"
	"github.com/rl-tproxy/rl-tproxy/pkg/sniff"
)

// Connections that leave their loop: one handed off after protocol
// detection (Config.Handoff), and one upgraded by a 101 (a byte tunnel).
// Both are served by a goroutine on a net.Conn made from the detached
// descriptor; the loop gets the connection's state back when it ends.

// sniff reads an inbound PROXY header where the service takes one, then
// classifies the first bytes of a connection; it reports whether the
// HTTP/1.x path goes on (false: waiting for more bytes, refused, or
// handed off).
func (c *clientConn) sniff(cfg *Config, svc *exchange.Service) bool {
	if svc.AcceptProxy != nil && !c.proxied {
		if done, ok := c.proxyHeader(cfg, svc); !done || !ok {
			return false // more bytes needed, or refused and closed
		}
		if cfg.Handoff == nil {
			return true // HTTP/1.x only
		}
	}
	kind := sniff.Detect(c.buf.unread())
	if kind == sniff.NeedMore {
		if c.buf.room() > 0 {
			c.setDeadline(c.headStart + int64(svc.HeaderTimeoutOrDefault()))
			return false
		}
		kind = sniff.HTTP1 // the parser judges a head this long
	}
	c.sniffed = true
	if kind == sniff.HTTP1 || !cfg.Handoff.Takes(kind, svc) {
		return true
	}
	c.handoff(cfg, svc, kind)
	return false
}

// proxyHeader reads an inbound PROXY header for a service with
// AcceptProxy: required from a trusted peer (it then names the client),
// refused from any other. done is false while more bytes are needed (the
// header timeout bounds the wait); ok is false when the connection was
// refused and closed (counted as a rejection with status 0).
func (c *clientConn) proxyHeader(cfg *Config, svc *exchange.Service) (done, ok bool) {
	b := c.buf.unread()
	h, n, err := proxyproto.Parse(b)
	trusted := svc.AcceptProxy.Contains(c.remote.Addr())
	switch {
	case err == proxyproto.ErrIncomplete:
		if c.buf.room() > 0 {
			c.setDeadline(c.headStart + int64(svc.HeaderTimeoutOrDefault()))
			return false, true
		}
		err = proxyproto.ErrV1TooLong // a buffer's worth without a header end
	case !trusted && err == proxyproto.ErrNotProxy:
		c.proxied = true // nothing to read from this peer: sniff as usual
		return true, true
	}
	rule := ""
	switch {
	case !trusted:
		rule = "proxy-header-untrusted" // a client claiming to be a balancer
	case err == proxyproto.ErrNotProxy:
		rule = "proxy-header-missing"
	case err != nil:
		rule = "proxy-header-invalid"
	}
	if rule != "" {
		cfg.Log().Debug("PROXY header refused", "service", svc.Name, "remote", c.remote, "rule", rule, "err", err)
		cfg.ReportReject(svc, c.remote, rule, 0)
		c.close()
		return false, false
	}
	c.buf.r += n
	c.proxied = true
	if !h.Local && h.Src.IsValid() {
		if c.ls.peers == nil {
			c.ls.peers = map[*clientConn]netip.AddrPort{}
		}
		c.ls.peers[c] = c.remote
		c.remote = netip.AddrPortFrom(h.Src.Addr().Unmap(), h.Src.Port())
	}
	return true, true
}

// peer is the TCP peer when a PROXY header named another client, else
// zero (Request.Peer).
func (c *clientConn) peer() netip.AddrPort {
	if !c.proxied {
		return netip.AddrPort{}
	}
	return c.ls.peers[c]
}

// sniffTimeout ends a connection whose first bytes did not decide its
// protocol within the header timeout: a would-be HTTP/1.x request gets
// 408, anything else is closed.
func (c *clientConn) sniffTimeout(cfg *Config, svc *exchange.Service) {
	if b := c.buf.unread(); len(b) > 0 && b[0] != 0x16 {
		c.rejectRule(cfg, svc, "header-timeout", 408)
		return
	}
	cfg.Log().Debug("protocol detection timed out", "service", svc.Name, "remote", c.remote)
	cfg.ReportReject(svc, c.remote, "detect-timeout", 0)
	c.close()
}

// handoff gives the connection to cfg.Handoff on a goroutine.
func (c *clientConn) handoff(cfg *Config, svc *exchange.Service, kind sniff.Kind) {
	c.state = lcDetached
	c.deadline = 0
	if c.r != nil {
		c.ls.putReq(c.r)
		c.r = nil
	}
	s := c.s
	c.s = nil
	hc := &exchange.HandoffConn{Kind: kind, Remote: c.remote, Local: c.local, Peer: c.peer(), Service: svc, Config: &cfg.Config,
		Start: c.start, HeaderDeadline: c.start.Add(svc.HeaderTimeoutOrDefault()), Drain: c.ls.p.drain}
	s.Detach(func(fd int, err error) {
		if err != nil {
			c.release()
			return
		}
		if un := s.Unread(); len(un) > 0 { // io_uring: received before the detach
			c.buf.addGrow(un)
		}
		c.ls.lg.offLoop.Add(1)
		go c.serveHandoff(fd, hc, cfg.Handoff)
	})
}

// serveHandoff runs on its own goroutine.
func (c *clientConn) serveHandoff(fd int, hc *exchange.HandoffConn, to exchange.Handoff) {
	lg := c.ls.lg
	defer lg.offLoop.Add(-1)
	nc, err := fileConn(fd)
	if err == nil {
		lg.detached.add(nc)
		keepAlive(nc)
		nc.SetReadDeadline(hc.HeaderDeadline)
		hc.Conn = nc
		hc.Buffered = c.buf.b[c.buf.r:c.buf.w]
		to.ServeConn(hc)
		nc.Close()
		lg.detached.remove(nc)
	}
	c.ls.l.Post(func() {
		c.buf.r = c.buf.w
		c.release()
	})
}

// fileConn makes a net.Conn of a detached descriptor (and closes fd).
func fileConn(fd int) (net.Conn, error) {
	f := os.NewFile(uintptr(fd), "tcp")
	nc, err := net.FileConn(f)
	f.Close()
	return nc, err
}

// tunnelJob relays an upgraded connection's bytes both ways.
type tunnelJob struct {
	c        *clientConn
	u        *upstreamConn
	cfd, ufd int
	got      int
	cIn, uIn []byte // bytes the loop received from each side before the detach
	idle     time.Duration
	last     atomic.Int64 // unix ns: the last bytes relayed either way
	endAt    atomic.Int64 // unix ns: one direction ended, the other's last read deadline (0: none)
}

// upgrade answers a 101 and hands both connections to a tunnel once the
// bytes queued for them reached the kernel (lcUpgrading until then).
func (c *clientConn) upgrade(u *upstreamConn, rest []byte) {
	r := c.r
	resp := &u.resp
	if !r.head.Upgrade || !resp.Upgrade {
		c.upFail(u, errors.New("101 Switching Protocols without an upgrade request"))
		return
	}
	r.res.Status = 101
	c.toClient(appendResponseHead(c.ls.scratch[:0], resp, r.extraHeaders(), respUpgrade), rest)
	if !c.buf.empty() {
		u.s.Write(c.buf.unread())
		c.buf.r = c.buf.w
	}
	c.pause() // what arrives now is the tunnel's, read after the detach
	if !u.paused {
		u.paused = true
		u.s.PauseRead()
	}
	c.state = lcUpgrading
	c.tun = &tunnelJob{c: c, u: u, cfd: -1, ufd: -1, idle: r.cfg.tunnelIdle(r.svc)}
	now := c.ls.l.Now()
	c.setDeadline(now + int64(c.tun.idle))
	c.detachTunnel()
	if c.state == lcUpgrading && now+int64(upgradingProbe) < c.timerAt {
		c.timerAt = now + int64(upgradingProbe) // onTimer probes the peers
		c.timer.Reset(c.timerAt)
	}
}

// upgradingProbe is how often a connection waiting in lcUpgrading checks
// that both peers are still there. Both sides' reading is paused then,
// and a reset of a paused socket is not reported by every loop backend
// (io_uring has no receive in flight to fail), so a peer that vanished
// would otherwise hold the other side's stalled bytes until the tunnel
// idle bound.
const upgradingProbe = time.Second

// upgradingPeerGone ends the connection when a peer's socket was reset
// (TCP state CLOSE) and reports whether it did. A peer that only shut
// its write side is still a tunnel peer: the tunnel relays that.
func (c *clientConn) upgradingPeerGone() bool {
	if err := sockGone(c.s); err != nil {
		c.abort()
		return true
	}
	if err := sockGone(c.tun.u.s); err != nil {
		c.r.res.UpstreamErr = fmt.Errorf("upgraded upstream: %w", err)
		c.close()
		return true
	}
	return false
}

// sockGone reports why s's connection is closed (reset, or failed), nil
// while it is open.
func sockGone(s *evloop.Sock) error {
	if s == nil || s.FD() < 0 {
		return nil
	}
	ti, err := unix.GetsockoptTCPInfo(s.FD(), unix.IPPROTO_TCP, unix.TCP_INFO)
	if err != nil || ti.State != tcpClose {
		return nil
	}
	if errno, err := unix.GetsockoptInt(s.FD(), unix.SOL_SOCKET, unix.SO_ERROR); err == nil && errno != 0 {
		return unix.Errno(errno)
	}
	return unix.ECONNRESET
}

// tcpClose is TCP_CLOSE of the kernel's TCP states (tcp_states.h).
const tcpClose = 7

// detachTunnel detaches both connections when nothing is queued on
// either: a Detach waits for its queued bytes without a bound, so the
// wait happens here, under the clientConn's deadline (tunnelStall), and the
// OnDrained of either side calls again.
func (c *clientConn) detachTunnel() {
	t, u := c.tun, c.tun.u
	if c.s.Pending() > 0 || u.s.Pending() > 0 {
		return
	}
	c.tun = nil
	c.r.up, u.c = nil, nil
	c.state = lcDetached
	c.deadline = 0
	cs, us := c.s, u.s
	c.s, u.s = nil, nil
	cs.Detach(func(fd int, err error) { t.cfd, t.cIn = fd, cs.Unread(); t.arrived() })
	us.Detach(func(fd int, err error) { t.ufd, t.uIn = fd, us.Unread(); t.arrived() })
}

// tunnelStall: a side did not take the bytes queued for it (the 101, or
// the client's early tunnel bytes) within the tunnel's idle bound.
func (c *clientConn) tunnelStall() {
	if c.s.Pending() > 0 {
		c.abort()
		return
	}
	c.r.res.UpstreamErr = fmt.Errorf("write to upgraded upstream: %w", errLoopTimeout)
	c.close()
}

// arrived runs on the loop as each descriptor is detached.
func (t *tunnelJob) arrived() {
	t.got++
	if t.got < 2 {
		return
	}
	if t.cfd < 0 || t.ufd < 0 {
		if t.cfd >= 0 {
			unix.Close(t.cfd)
		}
		if t.ufd >= 0 {
			unix.Close(t.ufd)
		}
		t.c.r.res.ClientAborted = t.cfd < 0
		t.done()
		return
	}
	t.c.ls.lg.offLoop.Add(1)
	go t.run()
}

// run relays until both directions end; once one ends, the other gets a
// bounded grace period. Either ends when no byte moved either way for
// t.idle, or when its destination takes no byte for t.idle.
func (t *tunnelJob) run() {
	lg := t.c.ls.lg
	defer lg.offLoop.Add(-1)
	cn, cerr := fileConn(t.cfd)
	un, uerr := fileConn(t.ufd)
	if cerr != nil || uerr != nil {
		if cn != nil {
			cn.Close()
		}
		if un != nil {
			un.Close()
		}
		t.c.ls.l.Post(t.done)
		return
	}
	lg.detached.add(cn)
	lg.detached.add(un)
	keepAlive(cn)
	keepAlive(un)
	t.last.Store(time.Now().UnixNano())
	ok := t.flush(un, t.cIn) && t.flush(cn, t.uIn)
	grace := min(t.idle, 10*time.Second)
	endOne := func(dst net.Conn) {
		if cw, ok := dst.(interface{ CloseWrite() error }); ok {
			cw.CloseWrite()
		}
		dl := time.Now().Add(grace)
		t.endAt.CompareAndSwap(0, dl.UnixNano())
		cn.SetReadDeadline(dl)
		un.SetReadDeadline(dl)
	}
	in := make(chan int64, 1)
	go func() {
		var n int64
		if ok {
			n = t.pipe(un, cn)
		}
		endOne(un)
		in <- n
	}()
	var n int64
	if ok {
		n = t.pipe(cn, un)
	}
	endOne(cn)
	m := <-in
	lg.detached.remove(cn)
	lg.detached.remove(un)
	cn.Close()
	un.Close()
	t.c.ls.l.Post(func() {
		t.c.r.res.BytesOut += n
		t.c.r.res.BytesIn += m
		t.done()
	})
}

// flush writes what the loop had received from the other side.
func (t *tunnelJob) flush(dst net.Conn, b []byte) bool {
	if len(b) == 0 {
		return true
	}
	dst.SetWriteDeadline(time.Now().Add(t.idle))
	_, err := dst.Write(b)
	return err == nil
}

// pipe copies src to dst until src ends or fails, dst takes no byte for
// t.idle, or no byte moved either way for t.idle; it returns the bytes
// copied. The read deadline moves on with every read: the other
// direction's traffic keeps an idle one alive.
func (t *tunnelJob) pipe(dst, src net.Conn) int64 {
	buf := make([]byte, 32<<10)
	var n int64
	for {
		dl := time.Now().Add(t.idle)
		if end := t.endAt.Load(); end != 0 {
			dl = time.Unix(0, end)
		}
		src.SetReadDeadline(dl)
		k, err := src.Read(buf)
		if k > 0 {
			now := time.Now()
			t.last.Store(now.UnixNano())
			dst.SetWriteDeadline(now.Add(t.idle))
			if _, werr := dst.Write(buf[:k]); werr != nil {
				return n
			}
			n += int64(k)
		}
		if err == nil {
			continue
		}
		if !isTimeout(err) || t.endAt.Load() != 0 || time.Since(time.Unix(0, t.last.Load())) >= t.idle {
			return n
		}
	}
}

// keepAlive has the kernel probe a connection that left its loop: a
// vanished peer then fails the tunnel or handoff before any idle bound.
func keepAlive(nc net.Conn) {
	if tc, ok := nc.(*net.TCPConn); ok {
		tc.SetKeepAliveConfig(net.KeepAliveConfig{Enable: true, Idle: 30 * time.Second, Interval: 15 * time.Second, Count: 4})
	}
}

// done reports the upgraded request and releases its state (loop).
func (t *tunnelJob) done() {
	c := t.c
	t.u.s = nil
	t.u.buf.put(t.u.ls)
	t.u.ls.putUp(t.u)
	c.close()
}
