package proxy

import (
	"math"
	"net/netip"
	"time"

	"github.com/rl-tproxy/rl-tproxy/pkg/evloop"
	"github.com/rl-tproxy/rl-tproxy/pkg/exchange"
	"github.com/rl-tproxy/rl-tproxy/pkg/httpparse"
)

// Client connection states on a loop.
const (
	lcFree      uint8 = iota // in the free list (or just closed: handlers stop)
	lcIdle                   // no request: waiting for the first byte of one
	lcHead                   // part of a head buffered: waiting for the rest
	lcAdmit                  // the Hook decides
	lcUpstream               // admitted: waiting for an upstream connection
	lcExchange               // request sent upstream (its body maybe still flowing), response awaited or relayed
	lcFlush                  // the answer is queued: waiting for it to reach the kernel
	lcClosing                // closing once the queued bytes are out (lingering: the client's bytes are discarded)
	lcGone                   // the socket is closed; a pending admission still owes its Resume
	lcDetached               // a goroutine serves it (handoff, upgrade tunnel)
	lcUpgrading              // a 101 was relayed: the tunnel waits for both sides' queued bytes to drain
)

// lingerMax bounds what a lingering close reads and discards.
const lingerMax = 256 << 10

// clientConn is one client connection on a loop. Idle, it holds no buffer and
// no request state (see reqState): only what identifies it.
type clientConn struct {
	ls    *loopState
	timer evloop.Timer
	clientConnVars
}

type clientConnVars struct {
	s             *evloop.Sock
	pick          func(*Config, netip.AddrPort) *exchange.Service
	remote, local netip.AddrPort
	buf           connBuf
	r             *reqState     // the request in flight
	pinned        *upstreamConn // idle upstream connection of this client (PROXY header)
	tun           *tunnelJob    // lcUpgrading: the tunnel to detach
	prev, next    *clientConn

	state      uint8
	paused     bool  // reading paused (buffer full, or upstream backpressure)
	eof        bool  // the client shut down its write side
	linger     bool  // unread client bytes may remain: close gracefully
	fresh      bool  // accepted, first request not started
	sniffed    bool  // protocol dispatch done
	inServe    bool  // serveBuffered runs (no recursion)
	proxied    bool  // Service.AcceptProxy's stage is done: remote is the client (ls.peers[c] the TCP peer when a PROXY header named another)
	nreq       int32 // requests started (saturates)
	discarded  int32 // bytes discarded while lingering (<= lingerMax + one read)
	freshUntil int64 // loop clock: a drain waits for the first request until then
	headStart  int64 // loop clock: first byte of the head being read
	start      time.Time
	timerAt    int64 // when the timer fires (0: not armed)
	deadline   int64 // when the current state times out (0: never)
}

// opened starts serving a just-accepted connection.
func (c *clientConn) opened() {
	cfg := c.ls.p.cfg.Load()
	svc := c.pick(cfg, c.local)
	if svc == nil {
		cfg.Log().Debug("no service for destination", "local", c.local, "remote", c.remote)
		c.close()
		return
	}
	now := c.ls.l.Now()
	c.fresh = true
	c.freshUntil = now + int64(svc.HeaderTimeoutOrDefault())
	c.state = lcIdle
	if c.ls.draining {
		c.setDeadline(c.freshUntil)
		return
	}
	c.setDeadline(now + int64(svc.IdleTimeoutOrDefault()))
}

// setDeadline makes the current state time out at at (loop clock). The
// timer is moved only when at is earlier than where it stands: a later
// deadline is found when it fires (onTimer re-arms), so most requests
// change no timer.
func (c *clientConn) setDeadline(at int64) {
	c.deadline = at
	if c.timerAt == 0 || at < c.timerAt {
		c.timerAt = at
		c.timer.Reset(at)
	}
}

func (c *clientConn) onTimer() {
	c.timerAt = 0
	if c.deadline == 0 || c.state == lcFree {
		return
	}
	if now := c.ls.l.Now(); now < c.deadline {
		next := c.deadline
		if c.state == lcUpgrading {
			if c.upgradingPeerGone() {
				return
			}
			next = min(next, now+int64(upgradingProbe))
		}
		c.timerAt = next
		c.timer.Reset(next)
		return
	}
	c.deadline = 0
	c.timeout()
}

// timeout ends the state whose deadline passed.
func (c *clientConn) timeout() {
	switch c.state {
	case lcIdle, lcClosing:
		c.close()
	case lcHead:
		cfg := c.ls.p.cfg.Load()
		svc := c.pick(cfg, c.local)
		if svc == nil {
			c.close()
			return
		}
		if c.nreq == 0 && svc.AcceptProxy != nil && !c.proxied && svc.AcceptProxy.Contains(c.remote.Addr()) {
			cfg.ReportReject(svc, c.remote, "proxy-header-timeout", 0) // a balancer that never finished its header
			c.close()
			return
		}
		if !c.sniffed && cfg.Handoff != nil && c.nreq == 0 {
			c.sniffTimeout(cfg, svc)
			return
		}
		c.rejectRule(cfg, svc, "header-timeout", 408)
	case lcAdmit:
		c.admitTimeout()
	case lcUpstream:
		c.r.upDrop()
		c.upstreamFail(errUpstreamTimeout(c.r.svc.Upstream))
	case lcExchange:
		c.exchangeTimeout()
	case lcFlush:
		c.abort() // the client does not take its answer
	case lcUpgrading:
		c.tunnelStall()
	}
}

// OnRead handles client bytes.
func (c *clientConn) OnRead(_ *evloop.Sock, b []byte) {
	switch c.state {
	case lcIdle, lcHead:
		if c.buf.b == nil {
			c.buf.get(c.ls, bufSize)
		}
		if !c.buf.add(b) {
			c.headTooBig()
			return
		}
		c.serveBuffered()
	case lcExchange:
		c.clientData(b)
	case lcAdmit, lcUpstream, lcFlush:
		if c.r != nil && !c.r.bodyDone && c.state == lcFlush {
			return // the exchange ended early: the rest of the body is not needed
		}
		c.bufferIn(b)
	case lcClosing:
		c.discarded += int32(len(b))
		if c.discarded > lingerMax {
			c.close()
		}
	}
}

// bufferIn keeps client bytes that arrive while a request is in flight
// (body bytes before the upstream is ready, pipelined requests); reading
// pauses while the buffer cannot take another read (one OnRead brings at
// most loopReadSize), and resumes only once it can (see flow).
func (c *clientConn) bufferIn(b []byte) {
	if c.buf.b == nil {
		c.buf.get(c.ls, bufSize)
	}
	c.buf.addGrow(b) // fits while reading pauses in time; a healthy client is never cut
	if c.buf.room() < loopReadSize {
		c.pause()
	}
}

func (c *clientConn) pause() {
	if !c.paused && c.s != nil {
		c.paused = true
		c.s.PauseRead()
	}
}

// resume reads the client again, unless its bytes would go to a buffer
// without room for a full read: then it stays paused until the buffered
// requests are served (flow).
func (c *clientConn) resume() {
	if c.paused && c.s != nil && c.canRead() {
		c.paused = false
		c.s.ResumeRead()
	}
}

// canRead reports whether a full read can be taken: a request body
// streaming upstream takes any read (clientData); otherwise the bytes go
// to the buffer, which needs room for loopReadSize.
func (c *clientConn) canRead() bool {
	if c.state == lcExchange && c.r != nil && !c.r.bodyDone {
		return true
	}
	return c.buf.b == nil || c.buf.room() >= loopReadSize
}

// flow pauses reading the client while its buffer cannot take a full read
// and resumes it once it can; while a request body streams upstream, the
// exchange paces reading (clientData, pumpChunked, the upstream's
// OnDrained).
func (c *clientConn) flow() {
	switch c.state {
	case lcIdle, lcHead, lcAdmit, lcUpstream, lcFlush:
	case lcExchange:
		if c.r == nil || !c.r.bodyDone {
			return
		}
	default:
		return
	}
	if c.canRead() {
		c.resume()
	} else {
		c.pause()
	}
}

// headTooBig answers a head that does not fit in the buffer.
func (c *clientConn) headTooBig() {
	cfg := c.ls.p.cfg.Load()
	if svc := c.pick(cfg, c.local); svc != nil {
		c.reject(cfg, svc, httpparse.ErrHeaderTooBig)
		return
	}
	c.close()
}

// OnEOF: the client shut down its write side. While a request is in
// flight (its head being read, its admission, its upstream connection or
// exchange) that is an abort, as nginx treats it by default
// (proxy_ignore_client_abort off): the check is cancelled, the upstream
// exchange dropped, nothing is reported. Once the whole answer is queued
// (lcFlush) the request is complete: the answer goes out, then the
// connection closes.
func (c *clientConn) OnEOF(*evloop.Sock) {
	c.eof = true
	switch c.state {
	case lcIdle, lcClosing:
		c.close()
	case lcHead:
		c.headAbort()
	case lcAdmit, lcUpstream, lcExchange:
		c.abort()
	}
}

// headAbort ends a connection whose client shut down its write side
// with part of a request head buffered: no request exists yet (nothing
// to log or report), so it is counted as the rejection "client-abort"
// with status 0 (nothing answered) and the connection closed.
func (c *clientConn) headAbort() {
	cfg := c.ls.p.cfg.Load()
	if svc := c.pick(cfg, c.local); svc != nil {
		cfg.ReportReject(svc, c.remote, "client-abort", 0)
	}
	c.abort()
}

// OnError: the client connection failed (reset); the loop closes it.
func (c *clientConn) OnError(*evloop.Sock, error) {
	c.s = nil
	c.abort()
}

// OnDrained: every queued byte reached the kernel.
func (c *clientConn) OnDrained(*evloop.Sock) {
	switch c.state {
	case lcFlush:
		c.finishRequest()
	case lcClosing:
		if !c.linger {
			c.close()
		}
	case lcUpgrading:
		c.detachTunnel()
	case lcExchange:
		if u := c.r.up; u != nil && u.paused {
			u.paused = false
			u.s.ResumeRead()
		}
	}
}

// OnConnect is not used for client connections.
func (c *clientConn) OnConnect(*evloop.Sock, error) {}

// serveBuffered parses and serves the requests buffered on c, one after
// another, until one has to wait; then reading goes on if the buffer can
// take a full read, or pauses until it can.
func (c *clientConn) serveBuffered() {
	if c.inServe {
		return
	}
	c.inServe = true
	c.serveLoop()
	c.inServe = false
	c.flow()
}

func (c *clientConn) serveLoop() {
	for {
		switch c.state {
		case lcIdle:
			if c.buf.empty() {
				c.goIdle()
				return
			}
			c.beginHead()
		case lcHead:
			if !c.parseHead() {
				return
			}
		default:
			return
		}
	}
}

func (c *clientConn) beginHead() {
	c.state = lcHead
	c.headStart = c.ls.l.Now()
	c.start = c.ls.now(c.ls.p.cfg.Load())
	if c.buf.r > 0 {
		c.buf.floor = 0
		c.buf.compact()
	}
}

// goIdle waits for the next request without a buffer.
func (c *clientConn) goIdle() {
	c.state = lcIdle
	c.buf.put(c.ls)
	c.resume()
	if c.ls.draining && !c.fresh {
		c.close()
		return
	}
	cfg := c.ls.p.cfg.Load()
	svc := c.pick(cfg, c.local)
	if svc == nil {
		c.close()
		return
	}
	c.setDeadline(c.ls.l.Now() + int64(svc.IdleTimeoutOrDefault()))
}

// parseHead parses the buffered head; it reports whether the state
// changed (false: the head is incomplete, wait for more bytes).
func (c *clientConn) parseHead() bool {
	cfg := c.ls.p.cfg.Load()
	svc := c.pick(cfg, c.local)
	if svc == nil {
		cfg.Log().Debug("no service for destination", "local", c.local, "remote", c.remote)
		c.close()
		return true
	}
	if c.nreq == 0 && (!c.sniffed && cfg.Handoff != nil || svc.AcceptProxy != nil && !c.proxied) {
		if !c.sniff(cfg, svc) {
			return c.state != lcHead
		}
	}
	if c.r == nil {
		c.r = c.ls.getReq(c)
	}
	h := &c.r.head
	err := h.Parse(c.buf.unread(), svc.Limits)
	if err == httpparse.ErrNeedMore {
		// Room for the largest head, and for a full read after what is
		// buffered (a read that does not fit would answer 431).
		if need := max(headNeed(svc.Limits), c.buf.w-c.buf.r+loopReadSize); need > len(c.buf.b) {
			c.growBuf(need)
		}
		if c.buf.room() == 0 {
			c.reject(cfg, svc, httpparse.ErrHeaderTooBig)
			return true
		}
		c.setDeadline(c.headStart + int64(svc.HeaderTimeoutOrDefault()))
		return false
	}
	if err != nil {
		c.reject(cfg, svc, err)
		return true
	}
	c.startRequest(cfg, svc)
	return true
}

// growBuf moves the buffered bytes to a buffer of need bytes (limits
// beyond the default head size).
func (c *clientConn) growBuf(need int) {
	var nb connBuf
	nb.get(c.ls, need)
	nb.add(c.buf.unread())
	c.buf.put(c.ls)
	c.buf = nb
}

// startRequest begins the exchange of the head just parsed.
func (c *clientConn) startRequest(cfg *Config, svc *exchange.Service) {
	r := c.r
	h := &r.head
	if h.Upgrade && upgradeIsH2C(h) {
		h.Upgrade = false // forwarded as a plain request (h2c.go)
	}
	dropHTTP2Settings(h) // never part of an upgrade the proxy performs
	c.buf.r += h.HeadLen
	c.buf.floor = c.buf.r
	if c.nreq < math.MaxInt32 {
		c.nreq++
	}
	c.fresh = false
	r.cfg, r.svc, r.hook = cfg, svc, cfg.Hook
	r.req = exchange.Request{Remote: c.remote, Local: c.local, Peer: c.peer(), Service: svc, Head: h, Start: c.start, Proto: exchange.ProtoHTTP11}
	if h.Minor == 0 {
		r.req.Proto = exchange.ProtoHTTP10
	}
	r.req.Path, r.req.Query = splitTarget(h.Target)
	r.res = exchange.Result{}
	r.dec = exchange.Decision{Allow: true}
	mode := h.BodyMode()
	r.bodyDone = mode == httpparse.BodyNone || mode == httpparse.BodyLength && h.ContentLength == 0
	if httpparse.EqualFold(h.Method, "CONNECT") {
		// A 2xx would turn the upstream connection into a tunnel: not
		// an exchange the proxy can frame, admit per request or pool.
		c.rejectRule(cfg, svc, "connect-unsupported", 501)
		return
	}
	if svc.MaxBodyBytes > 0 && mode == httpparse.BodyLength && h.ContentLength > svc.MaxBodyBytes {
		c.rejectRule(cfg, svc, "body-too-large", 413)
		return
	}
	if status, rule := exchange.CheckPath(svc, r.req.Path); status != 0 {
		c.rejectRule(cfg, svc, rule, status)
		return
	}
	c.deadline = 0
	if r.hook == nil {
		c.forward()
		return
	}
	c.state = lcAdmit
	c.admitDeadline(cfg)
	c.admit()
}

// keepClient reports whether the client connection may carry another
// request after this one.
func (c *clientConn) keepClient() bool {
	h := &c.r.head
	if h.Close || h.Minor == 0 || c.ls.p.shutdown.Load() || c.eof {
		return false
	}
	svc := c.r.svc
	return svc.MaxRequestsPerConn <= 0 || int(c.nreq) < svc.MaxRequestsPerConn
}

// complete ends the request in flight (or a connection-level answer when
// none is): once the answer reached the kernel, finishRequest reports it
// and the connection goes on (keep) or closes.
func (c *clientConn) complete(keep bool) {
	if c.r != nil {
		c.r.keep = keep
	} else if !keep {
		c.closeGraceful()
		return
	}
	c.state = lcFlush
	c.deadline = 0
	if c.s == nil || c.s.Pending() == 0 {
		c.finishRequest()
		return
	}
	c.setDeadline(c.ls.l.Now() + int64(c.r.svc.IdleTimeoutOrDefault()))
}

// finishRequest reports the request to the Hook and serves the next one
// or closes.
func (c *clientConn) finishRequest() {
	r := c.r
	if r.pending {
		c.closeGraceful() // the admission timed out: lateDecision reports it
		return
	}
	keep := r.keep
	if r.admitted {
		r.res.End = c.ls.now(r.cfg)
		r.hook.Done(&r.req, &r.dec, &r.res)
	}
	c.r = nil
	c.ls.putReq(r)
	c.buf.floor = 0
	if !keep || c.eof {
		c.closeGraceful()
		return
	}
	c.state = lcIdle
	if c.ls.draining {
		c.close()
		return
	}
	c.serveBuffered() // resumes reading once the buffer can take a full read
}

// closeGraceful closes after the queued bytes are out; when the client
// may still be sending (c.linger, or unread bytes), it half-closes and
// discards what arrives for a bounded time so that the answer is not
// destroyed by a reset.
func (c *clientConn) closeGraceful() {
	if c.s == nil {
		c.close()
		return
	}
	if !c.buf.empty() && !c.eof {
		c.linger = true
	}
	if c.r == nil {
		c.buf.put(c.ls)
	} // else a pending admission's Request points into it (lateDecision)
	c.state = lcClosing
	c.resume()
	if c.linger && !c.eof {
		c.s.CloseWrite()
		c.setDeadline(c.ls.l.Now() + int64(time.Second))
		return
	}
	c.linger = false
	if c.s.Pending() == 0 {
		c.close()
		return
	}
	c.setDeadline(c.ls.l.Now() + int64(5*time.Second))
}

// close closes the connection at once and gives everything back.
func (c *clientConn) close() {
	if c.state == lcFree {
		return
	}
	if c.s != nil {
		c.s.Close()
		c.s = nil
	}
	if r := c.r; r != nil {
		if r.pending {
			c.state = lcGone // the admission's Resume releases c
			return
		}
		if r.admitted {
			r.res.End = c.ls.now(r.cfg)
			r.hook.Done(&r.req, &r.dec, &r.res)
		}
		r.upDrop()
		c.r = nil
		c.ls.putReq(r)
	}
	c.release()
}

func (c *clientConn) release() {
	c.timer.Stop()
	if c.proxied {
		delete(c.ls.peers, c)
	}
	if c.pinned != nil {
		c.pinned.close()
		c.pinned = nil
	}
	c.buf.put(c.ls)
	c.ls.unlink(c)
	c.ls.lg.conns.Add(-1)
	c.ls.putConn(c)
}

// abort ends a connection whose client went away (reset, a FIN during
// admission or before its body arrived, or a forced shutdown): the
// request in flight is marked ClientAborted and its upstream exchange
// cancelled.
func (c *clientConn) abort() {
	if r := c.r; r != nil {
		r.res.ClientAborted = r.res.AdmissionErr == nil // else the proxy answered already
		if c.state == lcExchange || c.state == lcFlush {
			r.res.UpstreamErr = nil // a failed relay is not the upstream's
		}
		if r.pending && !r.cancelled {
			r.cancelled = true // at most once per Begin (AsyncHook)
			r.cancelAdmit()
		}
	}
	c.close()
}
