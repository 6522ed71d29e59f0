// Command evproto is a measurement prototype, not a proxy: the smallest
// HTTP/1.1 keep-alive relay on per-CPU edge-triggered epoll loops, built to
// count what a per-CPU event-loop design costs in system calls,
// context switches and CPU per request, a floor for pkg/proxy on its loops
// (`make bench`, test/bench/run.sh, runs it beside pkg/proxy and nginx).
//
// What it does per loop (one OS thread each, GOMAXPROCS loops by default):
// its own SO_REUSEPORT listener, epoll set, upstream keep-alive pool and
// buffer free list. Every socket is registered once, edge-triggered, for
// reading and writing, so no epoll_ctl runs per request. A read shorter
// than the buffer means the socket is drained (the next arrival raises a
// new edge), so no read returns EAGAIN on the common path. The forwarded
// head gets X-Forwarded-For inserted with one writev; the response (a
// Content-Length body) is relayed as it arrives.
//
// What it does not do (pkg/proxy does): strict parsing, request bodies,
// chunked framing, timeouts, admission. Its numbers are a floor for the
// system-call pattern, not a result for the product.
package main

import (
	"flag"
	"fmt"
	"net/netip"
	"os"
	"runtime"

	"golang.org/x/sys/unix"
)

const bufSize = 16 << 10

// strictParse is -strict: loops created after it is set parse strictly.
var strictParse bool

type kind uint8

const (
	kListener kind = iota + 1
	kClient
	kUpstream
)

// conn is a client or an upstream socket of one loop.
type conn struct {
	fd     int
	kind   kind
	buf    []byte // from the loop's free list while in use
	r, w   int
	peer   *conn // client <-> upstream while a request is in flight
	left   int   // response body bytes still to relay (upstream side)
	out    []byte
	outN   int  // bytes of out written (pending client write)
	waitW  bool // a write is pending until EPOLLOUT
	inEdge bool // a read edge came while a request was in flight
	xff    []byte
}

type loop struct {
	id       int
	epfd     int
	lfd      int
	upstream unix.Sockaddr
	conns    []*conn // by fd
	free     [][]byte
	idleUp   []*conn
	events   [128]unix.EpollEvent
	iov      [3][]byte
	p        parser
}

func main() {
	listen := flag.String("listen", "127.0.0.1:8080", "listen address")
	upstream := flag.String("upstream", "127.0.0.1:8081", "upstream address (IPv4)")
	loops := flag.Int("loops", runtime.GOMAXPROCS(0), "event loops (one OS thread each)")
	mode := flag.String("mode", "epoll", "syscall layer: epoll or uring (see uring.go)")
	flag.BoolVar(&strictParse, "strict", false, "parse both heads with pkg/httpparse, as the data path does")
	flag.Parse()
	la, err := netip.ParseAddrPort(*listen)
	if err != nil {
		fail(fmt.Errorf("listen %q: %w", *listen, err))
	}
	ua, err := netip.ParseAddrPort(*upstream)
	if err != nil {
		fail(fmt.Errorf("upstream %q: %w", *upstream, err))
	}
	errc := make(chan error, *loops)
	if *mode == "uring" {
		for i := 0; i < *loops; i++ {
			ready := make(chan error, 1)
			go func() { errc <- runUring(la, ua, ready) }()
			if err := <-ready; err != nil {
				fail(err)
			}
		}
		fail(<-errc)
	}
	if *mode != "epoll" {
		fail(fmt.Errorf("mode %q: want epoll or uring", *mode))
	}
	for i := 0; i < *loops; i++ {
		l, err := newLoop(i, la, ua)
		if err != nil {
			fail(err)
		}
		go func() { errc <- l.run() }()
	}
	fail(<-errc)
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "evproto:", err)
	os.Exit(1)
}

func sockaddr(a netip.AddrPort) unix.Sockaddr {
	return &unix.SockaddrInet4{Port: int(a.Port()), Addr: a.Addr().As4()}
}

func newLoop(id int, la, ua netip.AddrPort) (*loop, error) {
	lfd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("socket: %w", err)
	}
	unix.SetsockoptInt(lfd, unix.SOL_SOCKET, unix.SO_REUSEADDR, 1)
	unix.SetsockoptInt(lfd, unix.SOL_SOCKET, unix.SO_REUSEPORT, 1)
	if err := unix.Bind(lfd, sockaddr(la)); err != nil {
		return nil, fmt.Errorf("bind %s: %w", la, err)
	}
	if err := unix.Listen(lfd, 4096); err != nil {
		return nil, fmt.Errorf("listen: %w", err)
	}
	epfd, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("epoll_create1: %w", err)
	}
	l := &loop{id: id, epfd: epfd, lfd: lfd, upstream: sockaddr(ua), p: parser{strict: strictParse}}
	l.track(&conn{fd: lfd, kind: kListener})
	ev := unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(lfd)}
	if err := unix.EpollCtl(epfd, unix.EPOLL_CTL_ADD, lfd, &ev); err != nil {
		return nil, fmt.Errorf("epoll_ctl listener: %w", err)
	}
	return l, nil
}

func (l *loop) track(c *conn) {
	for c.fd >= len(l.conns) {
		l.conns = append(l.conns, make([]*conn, len(l.conns)+64)...)
	}
	l.conns[c.fd] = c
}

func (l *loop) getBuf() []byte {
	if n := len(l.free); n > 0 {
		b := l.free[n-1]
		l.free = l.free[:n-1]
		return b
	}
	return make([]byte, bufSize)
}

func (l *loop) putBuf(c *conn) {
	if c.buf != nil {
		l.free = append(l.free, c.buf)
		c.buf, c.r, c.w = nil, 0, 0
	}
}

func (l *loop) register(c *conn) error {
	l.track(c)
	ev := unix.EpollEvent{Events: unix.EPOLLIN | unix.EPOLLOUT | unix.EPOLLRDHUP | unix.EPOLLET, Fd: int32(c.fd)}
	return unix.EpollCtl(l.epfd, unix.EPOLL_CTL_ADD, c.fd, &ev)
}

func (l *loop) run() error {
	runtime.LockOSThread()
	for {
		n, err := unix.EpollWait(l.epfd, l.events[:], -1)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return fmt.Errorf("epoll_wait: %w", err)
		}
		for i := 0; i < n; i++ {
			ev := l.events[i]
			c := l.conns[ev.Fd]
			if c == nil {
				continue
			}
			switch c.kind {
			case kListener:
				l.accept()
			case kClient:
				l.client(c, ev.Events)
			case kUpstream:
				l.upstreamEvent(c, ev.Events)
			}
		}
	}
}

func (l *loop) accept() {
	for {
		fd, sa, err := unix.Accept4(l.lfd, unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC)
		if err != nil {
			return // EAGAIN or a transient error: the next edge retries
		}
		unix.SetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_NODELAY, 1)
		c := &conn{fd: fd, kind: kClient}
		if a, ok := sa.(*unix.SockaddrInet4); ok {
			c.xff = append([]byte("X-Forwarded-For: "), netip.AddrFrom4(a.Addr).String()...)
			c.xff = append(c.xff, "\r\n\r\n"...)
		}
		if err := l.register(c); err != nil {
			unix.Close(fd)
		}
	}
}

func (l *loop) closeConn(c *conn) {
	if c.fd < 0 {
		return
	}
	l.conns[c.fd] = nil
	unix.Close(c.fd) // also leaves the epoll set
	c.fd = -1
	l.putBuf(c)
	if p := c.peer; p != nil {
		c.peer, p.peer = nil, nil
		l.closeConn(p)
	}
}

// readMore reads until a short read; it reports false on EOF or an error.
func (l *loop) readMore(c *conn) (ok bool) {
	for {
		if c.buf == nil {
			c.buf = l.getBuf()
		}
		if c.w == len(c.buf) {
			return true // full: the caller consumes, then reads again
		}
		n, err := unix.Read(c.fd, c.buf[c.w:])
		if err == unix.EAGAIN {
			if c.r == c.w {
				l.putBuf(c)
			}
			return true
		}
		if err != nil || n == 0 {
			return false
		}
		c.w += n
		if c.w < len(c.buf) {
			return true // short read: drained until the next edge
		}
	}
}

func (l *loop) client(c *conn, events uint32) {
	if events&unix.EPOLLOUT != 0 && c.waitW {
		if !l.flushClient(c) {
			return
		}
	}
	if events&(unix.EPOLLIN|unix.EPOLLRDHUP|unix.EPOLLHUP|unix.EPOLLERR) == 0 {
		return
	}
	if c.peer != nil {
		c.inEdge = true // one request at a time: read after the response
		return
	}
	if !l.readMore(c) {
		l.closeConn(c)
		return
	}
	l.startRequest(c)
}

// startRequest forwards the buffered head (GET without body) upstream.
func (l *loop) startRequest(c *conn) {
	if c.r == c.w {
		return
	}
	n := l.p.requestHead(c.buf[c.r:c.w])
	if n == 0 {
		return // wait for the rest of the head
	}
	if n < 0 {
		l.closeConn(c)
		return
	}
	head := c.buf[c.r : c.r+n-2] // through the last field's CRLF
	c.r += n
	u, err := l.getUpstream()
	if err != nil {
		l.closeConn(c)
		return
	}
	u.peer, c.peer = c, u
	l.iov[0], l.iov[1] = head, c.xff
	if _, err := unix.Writev(u.fd, l.iov[:2]); err != nil {
		// A pooled connection may have died; a real proxy retries once.
		l.closeConn(c)
	}
}

func (l *loop) getUpstream() (*conn, error) {
	if n := len(l.idleUp); n > 0 {
		u := l.idleUp[n-1]
		l.idleUp = l.idleUp[:n-1]
		return u, nil
	}
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	// Blocking connect on loopback keeps the prototype short; the pool makes
	// it rare (once per upstream connection).
	if err := unix.Connect(fd, l.upstream); err != nil {
		unix.Close(fd)
		return nil, err
	}
	unix.SetNonblock(fd, true)
	unix.SetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_NODELAY, 1)
	u := &conn{fd: fd, kind: kUpstream, left: -1}
	if err := l.register(u); err != nil {
		unix.Close(fd)
		return nil, err
	}
	return u, nil
}

func (l *loop) upstreamEvent(u *conn, events uint32) {
	if events&(unix.EPOLLIN|unix.EPOLLRDHUP|unix.EPOLLHUP|unix.EPOLLERR) == 0 {
		return
	}
	c := u.peer
	if c == nil || c.waitW {
		if c == nil {
			l.closeConn(u) // idle upstream readable: a close or stray bytes
		}
		return
	}
	if !l.readMore(u) {
		l.closeConn(u)
		return
	}
	if u.left < 0 {
		n := l.p.responseLen(u.buf[u.r:u.w])
		if n == 0 {
			return
		}
		if n < 0 {
			l.closeConn(u) // the prototype relays Content-Length bodies only
			return
		}
		u.left = n
	}
	k := min(u.w-u.r, u.left)
	c.out, c.outN = u.buf[u.r:u.r+k], 0
	u.r += k
	u.left -= k
	if !l.flushClient(c) {
		return
	}
}

// flushClient writes c.out; on EAGAIN it waits for EPOLLOUT. It reports
// false when the client is gone or the write is pending.
func (l *loop) flushClient(c *conn) bool {
	u := c.peer
	for c.outN < len(c.out) {
		n, err := unix.Write(c.fd, c.out[c.outN:])
		if err == unix.EAGAIN {
			c.waitW = true
			return false
		}
		if err != nil {
			l.closeConn(c)
			return false
		}
		c.outN += n
	}
	c.waitW, c.out, c.outN = false, nil, 0
	if u == nil {
		return true
	}
	if u.left > 0 {
		if u.r < u.w {
			l.upstreamEvent(u, unix.EPOLLIN)
		} else {
			l.putBuf(u)
		}
		return true
	}
	// Response complete: pool the upstream, serve a pipelined request.
	u.left = -1
	c.peer, u.peer = nil, nil
	if u.r != u.w {
		l.closeConn(u)
	} else {
		l.putBuf(u)
		l.idleUp = append(l.idleUp, u)
	}
	if c.inEdge {
		c.inEdge = false
		if !l.readMore(c) {
			l.closeConn(c)
			return false
		}
	}
	if c.r == c.w {
		l.putBuf(c)
	} else {
		l.startRequest(c)
	}
	return true
}
