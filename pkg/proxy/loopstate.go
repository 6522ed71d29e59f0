package proxy

import (
	"net/netip"
	"time"

	"github.com/rl-tproxy/rl-tproxy/pkg/evloop"
)

// bufSize is the size of the loops' request and response buffers. It
// holds a default-limits head (8 KiB line + 16 KiB block) with room to
// spare.
const bufSize = 32 << 10

type bufArr = [bufSize]byte

// loopState is what one loop owns: its connections, free lists, upstream
// pools and the scratch buffer in which heads are built. It is touched
// only on the loop's thread.
type loopState struct {
	lg *loopGroup
	p  *Proxy
	l  *evloop.Loop

	conns    clientConnList
	freeConn []*clientConn
	freeReq  []*reqState
	freeUp   []*upstreamConn
	freeBuf  []*bufArr
	pools    map[string]*upstreamPool
	// peers holds the TCP peer of each connection whose PROXY header
	// named another client (clientConn.proxied): kept beside the
	// clientConn, not in it, which would outgrow an idle connection's
	// size class.
	peers    map[*clientConn]netip.AddrPort
	scratch  *bufArr   // heads and re-encoded chunks are built here, then written (Write copies)
	iov      [2][]byte // Write's arguments without a per-call slice
	draining bool
}

// loopFreeMax bounds each free list: what a burst needed beyond it goes
// to the garbage collector.
const loopFreeMax = 256

func newLoopState(lg *loopGroup, l *evloop.Loop) *loopState {
	return &loopState{lg: lg, p: lg.p, l: l, pools: map[string]*upstreamPool{}, scratch: new(bufArr)}
}

// now is the time a request's timing points record: Config.Now's when
// set, else the loop turn's (evloop.Loop.Time: one clock read per turn).
func (ls *loopState) now(cfg *Config) time.Time {
	if cfg.Now != nil {
		return cfg.Now()
	}
	return ls.l.Time()
}

func (ls *loopState) getBuf() *bufArr {
	if n := len(ls.freeBuf); n > 0 {
		b := ls.freeBuf[n-1]
		ls.freeBuf[n-1] = nil
		ls.freeBuf = ls.freeBuf[:n-1]
		return b
	}
	return new(bufArr)
}

func (ls *loopState) putBuf(b *bufArr) {
	if len(ls.freeBuf) < loopFreeMax {
		ls.freeBuf = append(ls.freeBuf, b)
	}
}

// write2 writes a then b (either may be empty) to s in one call.
func (ls *loopState) write2(s *evloop.Sock, a, b []byte) {
	if len(b) == 0 {
		ls.iov[0] = a
		s.Write(ls.iov[:1]...)
	} else {
		ls.iov[0], ls.iov[1] = a, b
		s.Write(ls.iov[:]...)
	}
	ls.iov[0], ls.iov[1] = nil, nil
}

// connBuf is a connection's read buffer on a loop: an array from the loop's
// free list while it holds bytes (or a head in use), none otherwise. The
// unread window is b[r:w]; floor is where compaction may move it (the end
// of the head of the request in flight, whose fields point into b).
type connBuf struct {
	arr         *bufArr // the loop's array while held (put gives it back)
	b           []byte  // arr[:], or a larger heap buffer (a head beyond bufArr, Limits beyond the default)
	r, w, floor int
}

func (b *connBuf) get(ls *loopState, need int) {
	if b.b != nil {
		return
	}
	if need > bufSize {
		b.b = make([]byte, need)
		return
	}
	b.arr = ls.getBuf()
	b.b = b.arr[:]
}

// put gives the array back (only when nothing in it is needed).
func (b *connBuf) put(ls *loopState) {
	if b.arr != nil {
		ls.putBuf(b.arr)
	}
	*b = connBuf{}
}

func (b *connBuf) unread() []byte { return b.b[b.r:b.w] }
func (b *connBuf) empty() bool    { return b.r == b.w }

// compact moves the unread window down to floor.
func (b *connBuf) compact() {
	if b.r == b.floor {
		return
	}
	n := copy(b.b[b.floor:], b.b[b.r:b.w])
	b.r, b.w = b.floor, b.floor+n
}

// room compacts when that helps and returns the free space after w.
func (b *connBuf) room() int {
	if len(b.b)-b.w < loopReadSize && b.r > b.floor {
		b.compact()
	}
	return len(b.b) - b.w
}

// add appends p (a buffer must be held); false when it does not fit.
func (b *connBuf) add(p []byte) bool {
	if len(b.b)-b.w < len(p) {
		b.compact()
		if len(b.b)-b.w < len(p) {
			return false
		}
	}
	b.w += copy(b.b[b.w:], p)
	return true
}

// addGrow appends p, moving the window to a larger buffer when it does
// not fit (a handoff's bytes received before its detach).
func (b *connBuf) addGrow(p []byte) {
	if b.b != nil && b.add(p) {
		return
	}
	nb := make([]byte, 0, b.w-b.r+len(p)+4096)
	nb = append(nb, b.unread()...)
	nb = append(nb, p...)
	b.b, b.r, b.w, b.floor = nb[:cap(nb)], 0, len(nb), 0
	// b.arr stays with b until put gives it back to the loop
}

// clientConnList is an intrusive list of a loop's client connections.
type clientConnList struct{ head *clientConn }

func (ls *loopState) link(c *clientConn) {
	c.prev, c.next = nil, ls.conns.head
	if c.next != nil {
		c.next.prev = c
	}
	ls.conns.head = c
}

func (ls *loopState) unlink(c *clientConn) {
	if c.prev != nil {
		c.prev.next = c.next
	} else if ls.conns.head == c {
		ls.conns.head = c.next
	}
	if c.next != nil {
		c.next.prev = c.prev
	}
	c.prev, c.next = nil, nil
}

func (ls *loopState) getConn() *clientConn {
	if n := len(ls.freeConn); n > 0 {
		c := ls.freeConn[n-1]
		ls.freeConn[n-1] = nil
		ls.freeConn = ls.freeConn[:n-1]
		return c
	}
	c := &clientConn{ls: ls}
	c.timer.Init(ls.l, c.onTimer)
	return c
}

func (ls *loopState) putConn(c *clientConn) {
	c.timer.Stop()
	c.clientConnVars = clientConnVars{}
	if len(ls.freeConn) < loopFreeMax {
		ls.freeConn = append(ls.freeConn, c)
	}
}

func (ls *loopState) getReq(c *clientConn) *reqState {
	var r *reqState
	if n := len(ls.freeReq); n > 0 {
		r = ls.freeReq[n-1]
		ls.freeReq[n-1] = nil
		ls.freeReq = ls.freeReq[:n-1]
	} else {
		r = &reqState{}
		r.resumeFn = r.resume
		r.asyncFn = r.asyncResume
		r.head.Reset()
	}
	r.c = c
	ls.lg.inFlight[ls.l.ID()].Add(1)
	return r
}

func (ls *loopState) putReq(r *reqState) {
	ls.lg.inFlight[ls.l.ID()].Add(-1)
	r.reset()
	if len(ls.freeReq) < loopFreeMax {
		ls.freeReq = append(ls.freeReq, r)
	}
}

// drain starts a graceful shutdown on this loop: idle connections close
// now, except fresh ones (accepted, first request not arrived), which get
// until their first request's header deadline.
func (ls *loopState) drain() {
	ls.draining = true
	for c := ls.conns.head; c != nil; {
		next := c.next
		if c.state == lcIdle {
			if c.fresh && ls.l.Now() < c.freshUntil {
				c.setDeadline(c.freshUntil)
			} else {
				c.close()
			}
		}
		c = next
	}
}

// closeAll closes every connection of the loop (Shutdown's deadline)
// except detached ones: their goroutine owns them until it posts their
// release (detachedConns.closeAll ends it), so closing them here too
// would release them twice.
func (ls *loopState) closeAll() {
	for c := ls.conns.head; c != nil; {
		next := c.next
		if c.state != lcDetached {
			c.abort()
		}
		c = next
	}
}

// closePools closes the idle upstream connections (end of Shutdown).
func (ls *loopState) closePools() {
	for _, pl := range ls.pools {
		pl.closeAll()
	}
}
