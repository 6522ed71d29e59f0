package proxy

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/rl-tproxy/rl-tproxy/pkg/evloop"
	"github.com/rl-tproxy/rl-tproxy/pkg/exchange"
	"github.com/rl-tproxy/rl-tproxy/pkg/httpparse"
	"github.com/rl-tproxy/rl-tproxy/pkg/proxyproto"
)

// upstreamConn is one upstream connection of a loop. While it idles in its pool
// (or pinned to its client) it stays registered: any byte or EOF then is
// a stray response or a close, and discards it at once.
type upstreamConn struct {
	ls        *loopState
	s         *evloop.Sock
	pool      *upstreamPool
	c         *clientConn // the client whose exchange it serves (nil while idle)
	owner     *clientConn // pinned: the client connection it belongs to
	buf       connBuf
	resp      httpparse.Response
	idleSince int64
	idx       int // position in pool.idle, -1 when not there

	reused, pinned, paused, connecting bool
	dialing                            bool // a goroutine dials or looks up: it owns u until done
	hostFirst, hostTries               int  // host-name upstream: first address index, addresses tried
	proxyVersion                       proxyproto.Version
	// afterConnect is Config.DialPrep's function for this connect
	// attempt, run once when it finished (connDone).
	afterConnect func()
}

// upstreamPool holds one loop's idle connections to one upstream address (LIFO).
type upstreamPool struct {
	ls      *loopState
	addr    string
	sa      unix.Sockaddr  // the address when it is an IP literal (else dialled by name)
	ap      netip.AddrPort // the same, for Config.DialPrep
	family  int
	h       *hostAddrs // the addresses when it is a host name (else nil)
	idle    []*upstreamConn
	timer   evloop.Timer
	timerAt int64
	idleFor int64 // UpstreamIdleTimeout in ns
	conns   int   // lups of this pool (idle, in use, dialling or waiting for a lookup)
	emptyAt int64 // when conns last fell to 0
}

// poolForget: a pool without a connection for this long is dropped from
// its loop (with a host name's addresses), so that upstreams a reloaded
// policy no longer names, or pod addresses that churn, do not pile up.
// A variable for tests.
var poolForget = time.Minute

func (ls *loopState) pool(addr string) *upstreamPool {
	if pl := ls.pools[addr]; pl != nil {
		return pl
	}
	pl := &upstreamPool{ls: ls, addr: addr}
	if ap, err := netip.ParseAddrPort(addr); err == nil {
		pl.ap = netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
		if a := ap.Addr().Unmap(); a.Is4() {
			pl.sa, pl.family = &unix.SockaddrInet4{Port: int(ap.Port()), Addr: a.As4()}, unix.AF_INET
		} else if a.Zone() == "" {
			pl.sa, pl.family = &unix.SockaddrInet6{Port: int(ap.Port()), Addr: a.As16()}, unix.AF_INET6
		}
	}
	if pl.sa == nil {
		pl.h = newHostAddrs(addr)
	}
	pl.timer.Init(ls.l, pl.prune)
	ls.pools[addr] = pl
	ls.lg.upPools.Add(1)
	return pl
}

func (ls *loopState) getUp(pl *upstreamPool) *upstreamConn {
	var u *upstreamConn
	if n := len(ls.freeUp); n > 0 {
		u = ls.freeUp[n-1]
		ls.freeUp[n-1] = nil
		ls.freeUp = ls.freeUp[:n-1]
	} else {
		u = &upstreamConn{ls: ls}
		u.resp.Reset()
	}
	u.pool, u.idx = pl, -1
	pl.conns++
	return u
}

func (ls *loopState) putUp(u *upstreamConn) {
	u.connDone()
	if pl := u.pool; pl != nil {
		if pl.conns--; pl.conns == 0 {
			pl.emptied()
		}
	}
	hs := u.resp.Headers
	*u = upstreamConn{ls: ls}
	u.resp.Headers = hs
	u.resp.Reset()
	if len(ls.freeUp) < loopFreeMax {
		ls.freeUp = append(ls.freeUp, u)
	}
}

// getUpstream hands c an upstream connection for its request: an idle
// one at once (upReady), or a new one when connected.
func (c *clientConn) getUpstream(fresh bool) {
	r := c.r
	svc := r.svc
	if svc.ProxyProtocol != proxyproto.None {
		if u := c.takePinned(svc, fresh); u != nil {
			c.upReady(u)
			return
		}
	} else if c.pinned != nil {
		c.pinned.close() // the service stopped using PROXY headers (Proxy.Update)
		c.pinned = nil
	}
	pl := c.ls.pool(svc.Upstream)
	if !fresh && svc.ProxyProtocol == proxyproto.None {
		if u := pl.take(r.cfg); u != nil {
			c.upReady(u)
			return
		}
	}
	u := c.ls.getUp(pl)
	u.c, r.up = c, u
	u.connecting = true
	if svc.ProxyProtocol != proxyproto.None {
		u.pinned, u.proxyVersion = true, svc.ProxyProtocol
	}
	if r.cfg.Dial == nil || r.cfg.DialPrep != nil {
		switch {
		case pl.sa != nil:
			if err := u.connectTo(r.cfg.DialPrep, pl.family, pl.sa, pl.ap); err != nil {
				u.dialFailed(err)
			}
			return
		case pl.h != nil:
			u.connectHost(r.cfg, svc.UpstreamTimeoutOrDefault())
			return
		}
	}
	u.dial(r.cfg, svc.UpstreamTimeoutOrDefault())
}

// takePinned returns c's idle pinned connection when it may serve svc.
func (c *clientConn) takePinned(svc *exchange.Service, fresh bool) *upstreamConn {
	u := c.pinned
	if u == nil {
		return nil
	}
	c.pinned = nil
	if fresh || u.pool.addr != svc.Upstream || u.proxyVersion != svc.ProxyProtocol {
		u.close()
		return nil
	}
	u.owner = nil
	u.reused = true
	return u
}

// connectTo starts a non-blocking connection to sa (ap) on the loop,
// prepared by prep (Config.DialPrep) when set; the error when it could
// not start (u is then still the caller's).
func (u *upstreamConn) connectTo(prep func(fd int, dst netip.AddrPort) (func(), error), family int, sa unix.Sockaddr, ap netip.AddrPort) error {
	fd, err := unix.Socket(family, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("dial upstream %s: %w", u.pool.addr, err)
	}
	unix.SetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_NODELAY, 1)
	if prep != nil {
		after, err := prep(fd, ap)
		if err != nil {
			unix.Close(fd)
			return fmt.Errorf("dial upstream %s: %w", u.pool.addr, err)
		}
		u.afterConnect = after
	}
	s, err := u.ls.l.Connect(fd, sa, u)
	if err != nil {
		unix.Close(fd)
		u.connDone()
		return fmt.Errorf("dial upstream %s: %w", u.pool.addr, err)
	}
	u.s = s
	u.connecting = true
	return nil
}

var defaultDialer = &net.Dialer{KeepAlive: 30 * time.Second}

// dial opens the connection on a goroutine (Config.Dial, or a host name
// to resolve) and posts the descriptor back to the loop.
func (u *upstreamConn) dial(cfg *Config, timeout time.Duration) {
	dial := cfg.Dial
	if dial == nil {
		dial = defaultDialer.DialContext
	}
	addr, l, lg := u.pool.addr, u.ls.l, u.ls.lg
	lg.workers.busy.Add(1)
	u.dialing = true
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		nc, err := dial(ctx, "tcp", addr)
		cancel()
		fd := -1
		if err == nil {
			fd, err = dupConnFD(nc)
			nc.Close()
		}
		if err != nil {
			err = fmt.Errorf("dial upstream %s: %w", addr, err)
		}
		l.Post(func() {
			lg.workers.busy.Add(-1)
			u.dialed(fd, err)
		})
	}()
}

// dupConnFD returns a non-blocking duplicate of nc's descriptor.
func dupConnFD(nc net.Conn) (int, error) {
	sc, ok := nc.(syscall.Conn)
	if !ok {
		return -1, fmt.Errorf("connection %T has no descriptor", nc)
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return -1, err
	}
	fd := -1
	var derr error
	if err := raw.Control(func(f uintptr) { fd, derr = unix.FcntlInt(f, unix.F_DUPFD_CLOEXEC, 0) }); err != nil {
		return -1, err
	}
	if derr != nil {
		return -1, derr
	}
	if err := unix.SetNonblock(fd, true); err != nil {
		unix.Close(fd)
		return -1, err
	}
	unix.SetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_NODELAY, 1)
	return fd, nil
}

// dialed takes a dialled descriptor onto the loop.
func (u *upstreamConn) dialed(fd int, err error) {
	u.dialing = false
	if err == nil && u.c == nil {
		unix.Close(fd) // the client went away meanwhile
	}
	if err != nil || u.c == nil {
		u.dialFailed(err)
		return
	}
	s, aerr := u.ls.l.Add(fd, u)
	if aerr != nil {
		unix.Close(fd)
		u.dialFailed(fmt.Errorf("dial upstream %s: %w", u.pool.addr, aerr))
		return
	}
	u.s = s
	u.OnConnect(s, nil)
}

// dialFailed gives u back and fails its client's request (if any).
func (u *upstreamConn) dialFailed(err error) {
	c := u.c
	u.s = nil
	u.ls.putUp(u)
	if c != nil && c.r != nil && c.r.up == u {
		c.r.up = nil
		c.upstreamFail(err)
	}
}

// connDone runs Config.DialPrep's function once the connect attempt
// finished (connected, failed, or abandoned).
func (u *upstreamConn) connDone() {
	if f := u.afterConnect; f != nil {
		u.afterConnect = nil
		f()
	}
}

// OnConnect: a connection opened by Connect is up (or failed).
func (u *upstreamConn) OnConnect(s *evloop.Sock, err error) {
	u.connecting = false
	u.connDone()
	if err != nil {
		if u.retryHost() { // the loop closes s after this returns
			return
		}
		u.dialFailed(fmt.Errorf("dial upstream %s: %w", u.pool.addr, err))
		return
	}
	c := u.c
	if c == nil {
		u.close()
		return
	}
	if u.pinned {
		var b [proxyproto.MaxLen]byte
		s.Write(proxyproto.Append(b[:0], u.proxyVersion, c.remote, c.local))
	}
	c.upReady(u)
}

// OnRead: response bytes, or stray bytes while u idles.
func (u *upstreamConn) OnRead(_ *evloop.Sock, b []byte) {
	if u.c == nil {
		u.discardIdle()
		return
	}
	u.c.upData(u, b)
}

// OnEOF: the upstream closed its side.
func (u *upstreamConn) OnEOF(*evloop.Sock) {
	if u.c == nil {
		u.discardIdle()
		return
	}
	u.c.upEOF(u, nil)
}

// OnError: the connection failed; the loop closes it.
func (u *upstreamConn) OnError(_ *evloop.Sock, err error) {
	u.s = nil
	if u.connecting {
		u.connecting = false
		u.connDone()
		if u.retryHost() {
			return
		}
		u.dialFailed(fmt.Errorf("dial upstream %s: %w", u.pool.addr, err))
		return
	}
	if u.c == nil {
		u.discardIdle()
		return
	}
	u.c.upEOF(u, err)
}

// OnDrained: the request bytes queued for u are out; a client paused for
// them reads again.
func (u *upstreamConn) OnDrained(*evloop.Sock) {
	if c := u.c; c != nil && c.state == lcUpgrading {
		c.detachTunnel()
		return
	}
	if c := u.c; c != nil && c.state == lcExchange {
		if c.r.bodyDone {
			// Paused by clientData when the last body byte went out: the
			// next request or the FIN is read again, as the buffer allows.
			c.flow()
		} else {
			c.resume()
		}
	}
}

// discardIdle closes an idle connection that received bytes or an EOF.
func (u *upstreamConn) discardIdle() {
	if u.owner != nil {
		u.owner.pinned = nil
		u.owner = nil
	} else {
		u.pool.remove(u)
	}
	u.ls.p.discarded.Add(1)
	u.close()
}

// close closes u and gives it back (it must be out of its pool).
func (u *upstreamConn) close() {
	if u.dialing {
		u.c = nil // dialed gives it back
		return
	}
	if u.s != nil {
		u.s.Close()
	}
	u.buf.put(u.ls)
	u.ls.putUp(u)
}

// releaseUp pools u after a clean exchange, pins it to c (PROXY header),
// or closes it; stray (unread bytes) counts it as discarded.
func (c *clientConn) releaseUp(u *upstreamConn, keep, stray bool) {
	if !keep || !u.buf.empty() {
		if stray || !u.buf.empty() {
			c.ls.p.discarded.Add(1)
		}
		u.close()
		return
	}
	u.buf.put(c.ls)
	u.reused = false
	if u.paused {
		u.paused = false
		u.s.ResumeRead()
	}
	if u.pinned {
		u.owner = c
		c.pinned = u
		return
	}
	u.pool.put(u, c.r.cfg)
}

// take returns the most recently pooled connection not idle too long.
func (pl *upstreamPool) take(cfg *Config) *upstreamConn {
	now := pl.ls.l.Now()
	idleFor := int64(exchange.DurationOr(cfg.UpstreamIdleTimeout, exchange.DefaultUpstreamIdleTimeout))
	for n := len(pl.idle); n > 0; n = len(pl.idle) {
		u := pl.idle[n-1]
		pl.remove(u)
		if now-u.idleSince >= idleFor {
			u.close()
			continue
		}
		u.reused = true
		return u
	}
	return nil
}

func (pl *upstreamPool) put(u *upstreamConn, cfg *Config) {
	maxIdle := cfg.MaxIdlePerUpstream
	if maxIdle == 0 {
		maxIdle = exchange.DefaultMaxIdlePerUpstream
	}
	if pl.ls.draining || pl.ls.p.shutdown.Load() || maxIdle < 0 || len(pl.idle) >= maxIdle {
		u.close()
		return
	}
	now := pl.ls.l.Now()
	u.idleSince = now
	u.idx = len(pl.idle)
	pl.idle = append(pl.idle, u)
	pl.ls.lg.upIdle.Add(1)
	pl.idleFor = int64(exchange.DurationOr(cfg.UpstreamIdleTimeout, exchange.DefaultUpstreamIdleTimeout))
	if pl.timerAt == 0 || pl.timerAt > now+pl.idleFor { // unarmed, or armed to forget the pool
		pl.timerAt = now + pl.idleFor
		pl.timer.Reset(pl.timerAt)
	}
}

func (pl *upstreamPool) remove(u *upstreamConn) {
	i := u.idx
	if i < 0 || i >= len(pl.idle) || pl.idle[i] != u {
		return
	}
	last := len(pl.idle) - 1
	pl.idle[i] = pl.idle[last]
	pl.idle[i].idx = i
	pl.idle[last] = nil
	pl.idle = pl.idle[:last]
	u.idx = -1
	pl.ls.lg.upIdle.Add(-1)
}

// emptied arms the timer to forget the pool once its last connection
// is gone.
func (pl *upstreamPool) emptied() {
	pl.emptyAt = pl.ls.l.Now()
	pl.timerAt = pl.emptyAt + int64(poolForget)
	pl.timer.Reset(pl.timerAt)
}

// prune closes the connections idle too long and re-arms for the oldest;
// a pool left without a connection for poolForget is dropped.
func (pl *upstreamPool) prune() {
	pl.timerAt = 0
	now := pl.ls.l.Now()
	oldest := int64(0)
	for i := 0; i < len(pl.idle); {
		u := pl.idle[i]
		if now-u.idleSince >= pl.idleFor {
			pl.remove(u)
			u.close()
			continue
		}
		if oldest == 0 || u.idleSince < oldest {
			oldest = u.idleSince
		}
		i++
	}
	switch {
	case len(pl.idle) > 0:
		pl.timerAt = oldest + pl.idleFor
		pl.timer.Reset(pl.timerAt)
	case pl.conns > 0: // in use: emptied re-arms when the last one goes
	case now-pl.emptyAt < int64(poolForget):
		pl.timerAt = pl.emptyAt + int64(poolForget)
		pl.timer.Reset(pl.timerAt)
	case pl.ls.pools[pl.addr] == pl:
		delete(pl.ls.pools, pl.addr)
		pl.ls.lg.upPools.Add(-1)
	}
}

func (pl *upstreamPool) closeAll() {
	for len(pl.idle) > 0 {
		u := pl.idle[len(pl.idle)-1]
		pl.remove(u)
		u.close()
	}
	pl.timer.Stop()
	pl.timerAt = 0
}
