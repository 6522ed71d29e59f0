package proxy

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/rl-tproxy/rl-tproxy/pkg/httpparse"
	"github.com/rl-tproxy/rl-tproxy/pkg/proxyproto"
)

// bufSize is the size of pooled read and write buffers. It holds a
// default-limits head (8 KiB line + 16 KiB block) with room to spare.
const bufSize = 32 << 10

type bufArr = [bufSize]byte

var bufPool = sync.Pool{New: func() any { return new(bufArr) }}

// buffer is a read buffer with an unread window b[r:w]. It holds a pooled
// array only while in use, so idle connections keep no buffer.
type buffer struct {
	arr  *bufArr
	b    []byte
	r, w int
}

func (b *buffer) get(need int) {
	if b.b != nil {
		return
	}
	if need <= bufSize {
		b.arr = bufPool.Get().(*bufArr)
		b.b = b.arr[:]
	} else {
		b.b = make([]byte, need)
	}
}

// put returns the array to the pool; the window must be empty.
func (b *buffer) put() {
	if b.arr != nil {
		bufPool.Put(b.arr)
	}
	b.arr, b.b, b.r, b.w = nil, nil, 0, 0
}

func (b *buffer) unread() []byte { return b.b[b.r:b.w] }

// compact moves the unread window to the front.
func (b *buffer) compact() {
	if b.r == 0 {
		return
	}
	n := copy(b.b, b.b[b.r:b.w])
	b.r, b.w = 0, n
}

// upConn is one upstream connection.
type upConn struct {
	nc        net.Conn
	raw       syscall.RawConn
	pool      *upPool
	buf       buffer
	resp      httpparse.Response
	reused    bool // came out of the idle pool
	pinned    bool // serves one client connection (PROXY header): never pooled
	idleSince time.Time
	healthy   bool
	checkFn   func(fd uintptr)
	readFn    func(fd uintptr) bool
	rn        int
	rerr      unix.Errno
	peek      [1]byte

	// proxyVersion is the PROXY header a pinned connection started with.
	proxyVersion proxyproto.Version
}

func newUpConn(nc net.Conn, pool *upPool) *upConn {
	u := &upConn{nc: nc, pool: pool}
	if sc, ok := nc.(syscall.Conn); ok {
		if raw, err := sc.SyscallConn(); err == nil {
			u.raw = raw
		}
	}
	u.checkFn = u.check
	u.readFn = u.rawRead
	return u
}

// check runs on the socket: an idle upstream connection must have nothing
// to read (data would be a stray response, EOF a close).
func (u *upConn) check(fd uintptr) {
	_, err := recvPeek(fd, u.peek[:])
	u.healthy = err == unix.EAGAIN
}

// buffered reports whether u's buffer holds bytes no exchange consumed.
func (u *upConn) buffered() bool { return u.buf.r != u.buf.w }

// clean reports whether u has no unread bytes, neither buffered nor queued
// on its socket, and was not closed by the upstream: only such a
// connection may carry another exchange.
func (u *upConn) clean() bool {
	if u.buffered() {
		return false
	}
	if u.raw == nil {
		return true
	}
	if err := u.raw.Control(u.checkFn); err != nil {
		return false
	}
	return u.healthy
}

// fill reads more bytes from the upstream into the buffer.
func (u *upConn) fill() (int, error) {
	if u.buf.w == len(u.buf.b) {
		u.buf.compact()
	}
	if u.raw == nil || u.buf.w == len(u.buf.b) {
		n, err := u.nc.Read(u.buf.b[u.buf.w:])
		u.buf.w += n
		return n, err
	}
	u.rn, u.rerr = 0, 0
	if err := u.raw.Read(u.readFn); err != nil {
		return 0, err
	}
	if u.rerr != 0 {
		return 0, &net.OpError{Op: "read", Net: "tcp", Source: u.nc.LocalAddr(), Addr: u.nc.RemoteAddr(),
			Err: os.NewSyscallError("read", u.rerr)}
	}
	if u.rn == 0 {
		return 0, io.EOF
	}
	u.buf.w += u.rn
	return u.rn, nil
}

// rawRead runs inside the runtime's poller loop (see rawio.go).
func (u *upConn) rawRead(fd uintptr) bool {
	n, err := sysRead(fd, u.buf.b[u.buf.w:])
	if err == unix.EAGAIN {
		return false
	}
	u.rn, u.rerr = n, err
	return true
}

func (u *upConn) close() {
	u.nc.Close()
	u.buf.put()
}

// upPool holds idle connections to one upstream address (LIFO).
type upPool struct {
	addr  string
	mu    sync.Mutex
	idle  []*upConn
	timer *time.Timer
	owner *upstreams
}

type upstreams struct {
	mu        sync.Mutex
	m         map[string]*upPool
	closed    atomic.Bool
	discarded atomic.Uint64 // connections found unclean (unread bytes, closed by the peer), pooled or pinned
}

func (us *upstreams) init() { us.m = map[string]*upPool{} }

func (us *upstreams) pool(addr string) *upPool {
	us.mu.Lock()
	defer us.mu.Unlock()
	p := us.m[addr]
	if p == nil {
		p = &upPool{addr: addr, owner: us}
		us.m[addr] = p
	}
	return p
}

// get returns a healthy idle connection to addr, or dials a new one.
func (us *upstreams) get(cfg *Config, addr string, timeout time.Duration, fresh bool) (*upConn, error) {
	p := us.pool(addr)
	if !fresh {
		idleTimeout := durOr(cfg.UpstreamIdleTimeout, DefaultUpstreamIdleTimeout)
		now := time.Now()
		for {
			p.mu.Lock()
			n := len(p.idle)
			if n == 0 {
				p.mu.Unlock()
				break
			}
			u := p.idle[n-1]
			p.idle[n-1] = nil
			p.idle = p.idle[:n-1]
			p.mu.Unlock()
			// Every reuse is checked: a byte that arrived while the
			// connection was idle belongs to no exchange (a stray or
			// early response, a body after HEAD), and an EOF is a close.
			// Either way the next client must never see it. A
			// connection merely idle too long is closed, not counted.
			if now.Sub(u.idleSince) >= idleTimeout {
				u.close()
				continue
			}
			if u.clean() {
				u.reused = true
				return u, nil
			}
			us.discard(u)
		}
	}
	dial := cfg.Dial
	if dial == nil {
		dial = defaultDialer.DialContext
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	nc, err := dial(ctx, "tcp", addr)
	cancel()
	if err != nil {
		return nil, fmt.Errorf("dial upstream %s: %w", addr, err)
	}
	if tc, ok := nc.(*net.TCPConn); ok {
		tc.SetNoDelay(true)
	}
	return newUpConn(nc, p), nil
}

var defaultDialer = &net.Dialer{KeepAlive: 30 * time.Second}

// discard closes u, which was found unclean (unread bytes, or closed by
// the upstream), and counts it in Stats.UpstreamDiscarded.
func (us *upstreams) discard(u *upConn) {
	us.discarded.Add(1)
	u.close()
}

// put returns u to its pool, or closes it when it cannot be reused. A
// response whose framing ended before the upstream's bytes did (bytes after
// a complete response, a body after HEAD, 204 or 304, a second response
// sent early) poisons the connection: it is closed, never handed out again.
//
// Only the buffered bytes are checked here (the buffer goes back to its
// pool, and what it held would be lost); the socket is peeked once, at
// reuse (get). Bytes or an EOF already queued at release are still queued
// then, so a second peek here would find nothing the reuse check misses.
func (us *upstreams) put(cfg *Config, u *upConn) {
	if u.buffered() {
		us.discard(u)
		return
	}
	u.buf.put()
	// The deadlines are left as they are: the next exchange sets both
	// before any I/O, and the health check does no I/O through Go.
	maxIdle := cfg.MaxIdlePerUpstream
	if maxIdle == 0 {
		maxIdle = DefaultMaxIdlePerUpstream
	}
	p := u.pool
	u.idleSince = time.Now()
	u.reused = false
	p.mu.Lock()
	if us.closed.Load() || maxIdle < 0 || len(p.idle) >= maxIdle {
		p.mu.Unlock()
		u.close()
		return
	}
	p.idle = append(p.idle, u)
	if p.timer == nil {
		idleTimeout := durOr(cfg.UpstreamIdleTimeout, DefaultUpstreamIdleTimeout)
		p.timer = time.AfterFunc(idleTimeout, func() { p.prune(idleTimeout) })
	}
	p.mu.Unlock()
}

// prune closes connections idle longer than idleTimeout and re-arms the
// timer while any remain.
func (p *upPool) prune(idleTimeout time.Duration) {
	now := time.Now()
	var drop []*upConn
	p.mu.Lock()
	keep := p.idle[:0]
	for _, u := range p.idle {
		if now.Sub(u.idleSince) >= idleTimeout {
			drop = append(drop, u)
		} else {
			keep = append(keep, u)
		}
	}
	for i := len(keep); i < len(p.idle); i++ {
		p.idle[i] = nil
	}
	p.idle = keep
	if len(p.idle) > 0 {
		p.timer.Reset(idleTimeout)
	} else {
		p.timer = nil
	}
	p.mu.Unlock()
	for _, u := range drop {
		u.close()
	}
}

func (us *upstreams) closeAll() {
	us.closed.Store(true)
	us.mu.Lock()
	pools := make([]*upPool, 0, len(us.m))
	for _, p := range us.m {
		pools = append(pools, p)
	}
	us.mu.Unlock()
	for _, p := range pools {
		p.mu.Lock()
		idle := p.idle
		p.idle = nil
		if p.timer != nil {
			p.timer.Stop()
			p.timer = nil
		}
		p.mu.Unlock()
		for _, u := range idle {
			u.close()
		}
	}
}

func (us *upstreams) idleCount() int {
	us.mu.Lock()
	defer us.mu.Unlock()
	n := 0
	for _, p := range us.m {
		p.mu.Lock()
		n += len(p.idle)
		p.mu.Unlock()
	}
	return n
}

// recvPeek peeks at the socket without blocking or consuming.
func recvPeek(fd uintptr, b []byte) (int, error) {
	for {
		n, _, errno := unix.Syscall6(unix.SYS_RECVFROM, fd, uintptr(unsafePtr(b)), uintptr(len(b)),
			unix.MSG_PEEK|unix.MSG_DONTWAIT, 0, 0)
		if errno == unix.EINTR {
			continue
		}
		if errno != 0 {
			return 0, errno
		}
		return int(n), nil
	}
}

func unsafePtr(b []byte) unsafe.Pointer { return unsafe.Pointer(unsafe.SliceData(b)) }
