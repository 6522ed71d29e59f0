package proxy

import (
	"errors"
	"io"
	"net"
	"net/netip"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/rl-tproxy/rl-tproxy/pkg/httpparse"
	"github.com/rl-tproxy/rl-tproxy/pkg/proxyproto"
)

const (
	stateIdle int32 = iota // waiting for the first byte of a request
	stateActive
	stateClosed
)

var aLongTimeAgo = time.Unix(1, 0)

// conn is one client connection. It is pooled: everything in it is reused
// by the next connection.
type conn struct {
	p      *Proxy
	nc     net.Conn
	raw    syscall.RawConn
	pick   func(*Config, netip.AddrPort) *Service
	remote netip.AddrPort
	local  netip.AddrPort
	state  atomic.Int32

	buf       buffer
	w         sockWriter
	rawReadFn func(uintptr) bool
	rn        int
	rerr      error

	// client-abort watcher (see watch.go)
	peekFn   func(uintptr) bool
	pfd      [1]unix.PollFd
	gone     atomic.Bool  // the client went away (set by the watcher)
	wmode    atomic.Int32 // watchAdmit or watchResponse
	watching bool         // a watcher runs for c (the connection goroutine's view)
	watchRsp bool         // this request's response phase is watched
	admitDL  time.Time    // the header deadline the admission watch reads under
	fin      bool         // response phase: the client half-closed (watcher's, read after watchDone)
	wmu      sync.Mutex
	wup      net.Conn // upstream connection the watcher closes when the client goes away
	actx     admitCtx

	// idle parking
	fd           int   // socket descriptor (-1: cannot park)
	slot         int32 // parker slot while parked
	idleDeadline time.Time
	watchDone    chan struct{}

	wb    []byte // write buffer (pooled array while in use)
	warr  *bufArr
	sarr  *bufArr // scratch for body copies
	lr    io.LimitedReader
	chunk httpparse.ChunkedDecoder

	head    httpparse.Request
	req     Request
	dec     Decision
	res     Result
	nreq    int
	linger  bool // unread client bytes may remain: close gracefully
	sent100 bool

	// A fresh connection (accepted, first request not started) is not
	// idle for a drain: the drain waits for its first request until
	// freshUntil (the header timeout after its first wait began).
	fresh      atomic.Bool
	freshUntil time.Time // set once, before the first stateIdle

	// protocol dispatch (handoff.go)
	started time.Time // first byte of the first request, when dispatch saw it
	hc      HandoffConn

	pinned *upConn                 // idle upstream connection of this client (pinned.go)
	ppbuf  [proxyproto.MaxLen]byte // PROXY header scratch
}

var connPool = sync.Pool{New: func() any {
	c := &conn{watchDone: make(chan struct{}, 1)}
	c.rawReadFn = c.rawRead
	c.w.init()
	c.peekFn = c.peekReady
	c.actx.c = c
	return c
}}

func newConn(p *Proxy, nc net.Conn, pick func(*Config, netip.AddrPort) *Service) *conn {
	c := connPool.Get().(*conn)
	c.p, c.nc, c.pick = p, nc, pick
	c.state.Store(stateActive)
	c.fresh.Store(true)
	c.fd, c.slot = -1, -1
	if sc, ok := nc.(syscall.Conn); ok {
		if raw, err := sc.SyscallConn(); err == nil {
			c.raw = raw
			raw.Control(func(fd uintptr) { c.fd = int(fd) })
		}
	}
	if a, ok := nc.RemoteAddr().(*net.TCPAddr); ok {
		c.remote = a.AddrPort()
		c.remote = netip.AddrPortFrom(c.remote.Addr().Unmap(), c.remote.Port())
	}
	if a, ok := nc.LocalAddr().(*net.TCPAddr); ok {
		c.local = a.AddrPort()
		c.local = netip.AddrPortFrom(c.local.Addr().Unmap(), c.local.Port())
	}
	return c
}

func (c *conn) release() {
	c.buf.put()
	c.putWB()
	c.putScratch()
	c.p, c.nc, c.raw, c.pick = nil, nil, nil, nil
	c.remote, c.local = netip.AddrPort{}, netip.AddrPort{}
	c.req, c.dec, c.res = Request{}, Decision{}, Result{}
	c.head.Reset()
	c.nreq, c.linger, c.sent100, c.fin = 0, false, false, false
	c.gone.Store(false)
	c.fresh.Store(false)
	c.freshUntil = time.Time{}
	c.started = time.Time{}
	c.dropPinned()
	c.lr = io.LimitedReader{}
	connPool.Put(c)
}

func (c *conn) getWB() []byte {
	if c.warr == nil {
		c.warr = bufPool.Get().(*bufArr)
	}
	c.wb = c.warr[:0]
	return c.wb
}

func (c *conn) putWB() {
	if c.warr != nil {
		bufPool.Put(c.warr)
	}
	c.warr, c.wb = nil, nil
}

func (c *conn) scratch() []byte {
	if c.sarr == nil {
		c.sarr = bufPool.Get().(*bufArr)
	}
	return c.sarr[:]
}

func (c *conn) putScratch() {
	if c.sarr != nil {
		bufPool.Put(c.sarr)
	}
	c.sarr = nil
}

// rawRead reads into the buffer inside the runtime's poller loop. When
// nothing is there yet and the buffer is empty, the buffer goes back to the
// pool while the connection waits: idle keep-alive connections hold none.
func (c *conn) rawRead(fd uintptr) bool {
	if c.buf.b == nil {
		c.buf.get(bufSize)
	}
	n, err := sysRead(fd, c.buf.b[c.buf.w:])
	if err == unix.EAGAIN {
		if c.buf.w == 0 {
			c.buf.put()
		}
		return false
	}
	c.rn, c.rerr = n, nil
	if err != 0 {
		c.rn = 0
		c.rerr = os.NewSyscallError("read", err)
	}
	return true
}

// fill reads more client bytes into buf.b[w:] (need: minimum buffer size).
func (c *conn) fill(need int) (int, error) {
	if c.raw != nil && need <= bufSize {
		c.rn, c.rerr = 0, nil
		if err := c.raw.Read(c.rawReadFn); err != nil {
			return 0, err
		}
		if c.rerr != nil {
			return 0, c.rerr
		}
		if c.rn == 0 {
			return 0, io.EOF
		}
		c.buf.w += c.rn
		return c.rn, nil
	}
	c.buf.get(need)
	n, err := c.nc.Read(c.buf.b[c.buf.w:])
	c.buf.w += n
	if n > 0 {
		err = nil
	}
	return n, err
}

func headNeed(lim httpparse.Limits) int {
	l, h := lim.MaxRequestLine, lim.MaxHeaderBytes
	if l <= 0 {
		l = httpparse.DefaultMaxRequestLine
	}
	if h <= 0 {
		h = httpparse.DefaultMaxHeaderBytes
	}
	return max(l, h) + 4
}

func (c *conn) serve() {
	for {
		// The idle wait runs from this shallow frame so that the stack of
		// an idle connection's goroutine stays small.
		if c.buf.r == c.buf.w {
			switch c.waitIdle() {
			case idleParked:
				return // the parker owns c now
			case idleClose:
				c.finish()
				return
			}
		}
		if c.nreq == 0 && c.started.IsZero() {
			if cfg := c.p.cfg.Load(); cfg.Handoff != nil && c.dispatch(cfg) {
				c.finish()
				return
			}
		}
		if !c.serveOne() {
			c.finish()
			return
		}
		// Idle connections keep no buffers.
		c.putWB()
		c.putScratch()
	}
}

const (
	idleReady = iota
	idleClose
	idleParked
)

// waitIdle waits for the first byte of the next request for up to the
// idle timeout; after ParkIdleAfter it parks the connection instead.
func (c *conn) waitIdle() int {
	cfg := c.p.cfg.Load()
	svc := c.pick(cfg, c.local)
	if svc == nil {
		return idleClose
	}
	c.buf.r, c.buf.w = 0, 0
	now := time.Now()
	fresh := c.fresh.Load()
	if fresh && c.freshUntil.IsZero() {
		c.freshUntil = now.Add(svc.headerTimeout())
	}
	c.state.Store(stateIdle)
	if c.p.shutdown.Load() && !fresh {
		return idleClose
	}
	c.idleDeadline = now.Add(svc.idleTimeout())
	wait := c.idleDeadline
	if pa := cfg.parkIdleAfter(); pa > 0 && c.fd >= 0 && now.Add(pa).Before(wait) {
		wait = now.Add(pa)
	}
	need := headNeed(svc.Limits)
	c.nc.SetReadDeadline(wait)
	_, err := c.fill(need)
	if err != nil && wait.Before(c.idleDeadline) && isTimeout(err) && c.buf.w == 0 {
		parked, closed := c.p.parker.park(c)
		if parked {
			return idleParked
		}
		if closed {
			return idleClose
		}
		c.nc.SetReadDeadline(c.idleDeadline) // could not park: wait here
		_, err = c.fill(need)
	}
	if err != nil || !c.state.CompareAndSwap(stateIdle, stateActive) {
		return idleClose // idle timeout, close, reset or drain
	}
	c.fresh.Store(false)
	return idleReady
}

// waitsFirst reports whether c is a fresh connection whose first request
// a drain still waits for at now. Call it only after observing c idle or
// parked (freshUntil is written before the first stateIdle).
func (c *conn) waitsFirst(now time.Time) bool {
	return c.fresh.Load() && now.Before(c.freshUntil)
}

func (c *conn) finish() {
	c.state.Store(stateClosed)
	if c.linger {
		lingerClose(c.nc)
	} else {
		c.nc.Close()
	}
	p := c.p
	p.untrack(c)
	c.release()
}

// lingerClose half-closes, then drains what the client still sends for a
// bounded time, so the answer is not destroyed by a reset.
func lingerClose(nc net.Conn) {
	if tc, ok := nc.(*net.TCPConn); ok {
		tc.CloseWrite()
		tc.SetReadDeadline(time.Now().Add(time.Second))
		var b [512]byte
		for i := 0; i < 512; i++ { // at most 256 KiB
			if _, err := tc.Read(b[:]); err != nil {
				break
			}
		}
	}
	nc.Close()
}

// serveOne handles one request; it reports whether the connection stays.
func (c *conn) serveOne() bool {
	p := c.p
	cfg := p.cfg.Load()
	svc := c.pick(cfg, c.local)
	if svc == nil {
		cfg.logger().Debug("no service for destination", "local", c.local, "remote", c.remote)
		return false
	}
	lim := svc.Limits
	need := headNeed(lim)

	if c.buf.r > 0 && len(c.buf.b)-c.buf.r < need {
		c.buf.compact()
	}
	start := cfg.now()
	if !c.started.IsZero() { // dispatch saw the first byte
		start = c.started
		c.started = time.Time{}
	}
	// The header deadline is armed only when the head needs another read:
	// most heads arrive whole with the idle wait's read, and a deadline
	// update costs a runtime timer change per request.
	armed := false
	h := &c.head
	for {
		err := h.Parse(c.buf.unread(), lim)
		if err == nil {
			break
		}
		if err != httpparse.ErrNeedMore {
			return c.reject(cfg, svc, err)
		}
		if c.buf.w == len(c.buf.b) {
			if c.buf.r == 0 {
				return c.reject(cfg, svc, httpparse.ErrHeaderTooBig)
			}
			c.buf.compact()
		}
		if !armed {
			c.nc.SetReadDeadline(start.Add(svc.headerTimeout()))
			armed = true
		}
		if _, err := c.fill(need); err != nil {
			if isTimeout(err) {
				c.rejectRule(cfg, svc, "header-timeout", 408)
			}
			return false
		}
	}
	if h.Upgrade && upgradeIsH2C(h) {
		h.Upgrade = false // forwarded as a plain request (h2c.go)
	}
	headStart := c.buf.r
	c.buf.r += h.HeadLen
	c.nreq++
	c.sent100 = false

	c.req = Request{Remote: c.remote, Local: c.local, Service: svc, Head: h, Start: start, Proto: ProtoHTTP11}
	if h.Minor == 0 {
		c.req.Proto = ProtoHTTP10
	}
	c.req.Path, c.req.Query = splitTarget(h.Target)
	c.res = Result{}
	c.dec = Decision{Allow: true}

	mode := h.BodyMode()
	if svc.MaxBodyBytes > 0 && mode == httpparse.BodyLength && h.ContentLength > svc.MaxBodyBytes {
		return c.rejectRule(cfg, svc, "body-too-large", 413)
	}

	hook := cfg.Hook
	c.watchRsp = false
	if hook != nil {
		// The client-abort watcher reads under the header deadline (not
		// the idle wait's, which may be only ParkIdleAfter).
		c.admitDL = start.Add(svc.headerTimeout())
		_, onDemand := hook.(OnDemandWatcher)
		if !armed && !onDemand {
			c.nc.SetReadDeadline(c.admitDL)
		}
		// A request whose body is already buffered needs no more client
		// reads before its response: the watcher keeps watching through
		// the upstream exchange.
		follow := !h.Upgrade && (mode == httpparse.BodyNone ||
			mode == httpparse.BodyLength && int64(c.buf.w-c.buf.r) >= h.ContentLength)
		c.dec = c.admit(hook, follow, onDemand)
		if c.gone.Load() {
			c.watchStop()
			c.res.ClientAborted = true
			c.res.End = cfg.now()
			hook.Done(&c.req, &c.dec, &c.res)
			return false
		}
		if !c.dec.Allow {
			keep := c.deny(cfg, svc)
			c.res.End = cfg.now()
			hook.Done(&c.req, &c.dec, &c.res)
			return keep
		}
	}
	keep := c.forward(cfg, svc, headStart+h.HeadLen)
	if c.watching && c.watchStop() {
		c.res.ClientAborted, c.res.UpstreamErr = true, nil
		keep = false
	}
	c.res.End = cfg.now()
	if hook != nil {
		hook.Done(&c.req, &c.dec, &c.res)
	}
	return keep
}

// splitTarget splits an origin- or absolute-form target into path and
// query.
func splitTarget(t []byte) (path, query []byte) {
	if len(t) > 0 && t[0] != '/' {
		// absolute-form: skip scheme://authority
		for i := 0; i+2 < len(t); i++ {
			if t[i] == ':' && t[i+1] == '/' && t[i+2] == '/' {
				rest := t[i+3:]
				j := 0
				for j < len(rest) && rest[j] != '/' && rest[j] != '?' {
					j++
				}
				t = rest[j:]
				break
			}
		}
	}
	for i, b := range t {
		if b == '?' {
			return t[:i], t[i+1:]
		}
	}
	return t, nil
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// reject answers a parse error with its status and closes.
func (c *conn) reject(cfg *Config, svc *Service, err error) bool {
	status := 400
	rule := "malformed"
	var pe *httpparse.Error
	if errors.As(err, &pe) {
		status, rule = pe.Status, pe.Rule
	}
	return c.rejectRule(cfg, svc, rule, status)
}

// rejectRule answers status for a violated rule, logs and reports it, and
// marks the connection for a graceful close.
func (c *conn) rejectRule(cfg *Config, svc *Service, rule string, status int) bool {
	cfg.logger().Debug("request rejected", "service", svc.Name, "rule", rule, "status", status, "remote", c.remote)
	reportReject(cfg, svc, c.remote, rule, status)
	c.answer(status, "Connection: close\r\n")
	c.linger = true
	return false
}

// reportReject tells Config.OnReject and the Hook's Rejecter (both, when
// set) that the proxy ended a request or connection under rule.
func reportReject(cfg *Config, svc *Service, remote netip.AddrPort, rule string, status int) {
	if cfg.OnReject != nil {
		cfg.OnReject(svc, remote, rule, status)
	}
	if r, ok := cfg.Hook.(Rejecter); ok {
		r.Reject(svc, remote, rule, status)
	}
}

// answer writes a short plain-text answer from the proxy itself.
func (c *conn) answer(status int, extra string) {
	b := c.getWB()
	b = appendStatusLine(b, status, nil)
	text := statusBody(status)
	b = append(b, "Content-Type: text/plain; charset=utf-8\r\nContent-Length: "...)
	b = strconv.AppendInt(b, int64(len(text)), 10)
	b = append(b, "\r\n"...)
	b = append(b, extra...)
	b = append(b, "\r\n"...)
	b = append(b, text...)
	c.nc.SetWriteDeadline(time.Now().Add(5 * time.Second))
	n, _ := c.w.writeAll(c.nc, c.raw, b)
	c.res.Status = status
	c.res.BytesOut += int64(n)
}

func statusBody(status int) string {
	switch status {
	case 400:
		return "400 Bad Request\n"
	case 408:
		return "408 Request Timeout\n"
	case 413:
		return "413 Content Too Large\n"
	case 414:
		return "414 URI Too Long\n"
	case 417:
		return "417 Expectation Failed\n"
	case 431:
		return "431 Request Header Fields Too Large\n"
	case 501:
		return "501 Not Implemented\n"
	case 502:
		return "502 Bad Gateway\n"
	case 504:
		return "504 Gateway Timeout\n"
	case 505:
		return "505 HTTP Version Not Supported\n"
	}
	return strconv.Itoa(status) + "\n"
}

// deny answers the Decision's status, fields and body.
func (c *conn) deny(cfg *Config, svc *Service) bool {
	h := &c.head
	d := &c.dec
	status := d.Status
	if status < 200 || status > 599 {
		status = 429
	}
	keep := c.keepClient(svc)
	switch h.BodyMode() {
	case httpparse.BodyLength:
		if int64(c.buf.w-c.buf.r) >= h.ContentLength {
			c.buf.r += int(h.ContentLength)
			c.res.BytesIn = h.ContentLength
		} else {
			keep = false
		}
	case httpparse.BodyChunked:
		keep = false
	}
	b := c.getWB()
	b = appendStatusLine(b, status, nil)
	for i := range d.Header {
		b = appendHeaderBytes(b, d.Header[i].Name, d.Header[i].Value)
	}
	if d.ContentType != "" {
		b = append(b, "Content-Type: "...)
		b = append(b, d.ContentType...)
		b = append(b, "\r\n"...)
	}
	b = append(b, "Content-Length: "...)
	b = strconv.AppendInt(b, int64(len(d.Body)), 10)
	b = append(b, "\r\n"...)
	if !keep {
		b = append(b, "Connection: close\r\n"...)
	}
	b = append(b, "\r\n"...)
	if !httpparse.EqualFold(h.Method, "HEAD") {
		b = append(b, d.Body...)
	}
	c.nc.SetWriteDeadline(time.Now().Add(svc.idleTimeout()))
	n, err := c.w.writeAll(c.nc, c.raw, b)
	c.res.Status = status
	c.res.BytesOut = int64(n)
	if err != nil {
		c.res.ClientAborted = true
		return false
	}
	if !keep {
		c.linger = true
	}
	return keep
}

// keepClient reports whether the client connection may carry another
// request after this one.
func (c *conn) keepClient(svc *Service) bool {
	if c.head.Close || c.head.Minor == 0 || c.p.shutdown.Load() {
		return false
	}
	if svc.MaxRequestsPerConn > 0 && c.nreq >= svc.MaxRequestsPerConn {
		return false
	}
	return true
}
