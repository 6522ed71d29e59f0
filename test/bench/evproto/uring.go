package main

import (
	"fmt"
	"net/netip"
	"runtime"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The io_uring variant (-mode uring) of the same relay, to measure the
// other syscall layer: one multishot accept per loop, one
// multishot recv per socket drawing from a registered provided-buffer ring
// (an idle connection holds no buffer; a pooled upstream connection stays
// armed, so bytes or a close while it idles discard it without a peek),
// writev and send as submissions, and one io_uring_enter per loop turn
// that submits everything the turn queued and waits for the next
// completion.

const (
	sysIOUringSetup = 425
	sysIOUringEnter = 426

	opWritev = 2
	opAccept = 13
	opSend   = 26
	opRecv   = 27

	setupSingleIssuer = 1 << 12
	setupDeferTask    = 1 << 13
	enterGetEvents    = 1
	acceptMultishot   = 1
	cqeFMore          = 1 << 1
	featSingleMmap    = 1
	offSQEs           = 0x10000000
)

type sqringOffsets struct {
	head, tail, ringMask, ringEntries, flags, dropped, array, resv1 uint32
	userAddr                                                        uint64
}

type cqringOffsets struct {
	head, tail, ringMask, ringEntries, overflow, cqes, flags, resv1 uint32
	userAddr                                                        uint64
}

type uringParams struct {
	sqEntries, cqEntries, flags, sqThreadCPU, sqThreadIdle, features, wqFd uint32
	resv                                                                   [3]uint32
	sqOff                                                                  sqringOffsets
	cqOff                                                                  cqringOffsets
}

type sqe struct {
	opcode   uint8
	flags    uint8
	ioprio   uint16
	fd       int32
	off      uint64
	addr     uint64
	len      uint32
	opFlags  uint32
	userData uint64
	bufIndex uint16
	pers     uint16
	spliceIn int32
	addr3    uint64
	pad      uint64
}

type cqe struct {
	userData uint64
	res      int32
	flags    uint32
}

type ring struct {
	fd             int
	sqHead, sqTail *uint32
	sqMask         uint32
	sqArray        unsafe.Pointer
	sqes           unsafe.Pointer
	cqHead, cqTail *uint32
	cqMask         uint32
	cqes           unsafe.Pointer
	pending        uint32 // SQEs queued since the last enter
	mem, sqeMem    []byte
	sqEntries      uint32
}

func newRing(entries uint32) (*ring, error) {
	var p uringParams
	p.flags = setupSingleIssuer | setupDeferTask
	fd, _, e := unix.Syscall(sysIOUringSetup, uintptr(entries), uintptr(unsafe.Pointer(&p)), 0)
	if e != 0 {
		return nil, fmt.Errorf("io_uring_setup: %w", e)
	}
	if p.features&featSingleMmap == 0 {
		return nil, fmt.Errorf("io_uring: kernel without IORING_FEAT_SINGLE_MMAP")
	}
	size := max(p.sqOff.array+p.sqEntries*4, p.cqOff.cqes+p.cqEntries*uint32(unsafe.Sizeof(cqe{})))
	mem, err := unix.Mmap(int(fd), 0, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE)
	if err != nil {
		return nil, fmt.Errorf("mmap rings: %w", err)
	}
	sqeMem, err := unix.Mmap(int(fd), offSQEs, int(p.sqEntries)*int(unsafe.Sizeof(sqe{})),
		unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE)
	if err != nil {
		return nil, fmt.Errorf("mmap sqes: %w", err)
	}
	base := unsafe.Pointer(&mem[0])
	r := &ring{fd: int(fd), mem: mem, sqeMem: sqeMem, sqEntries: p.sqEntries}
	r.sqHead = (*uint32)(unsafe.Add(base, p.sqOff.head))
	r.sqTail = (*uint32)(unsafe.Add(base, p.sqOff.tail))
	r.sqMask = *(*uint32)(unsafe.Add(base, p.sqOff.ringMask))
	r.sqArray = unsafe.Add(base, p.sqOff.array)
	r.sqes = unsafe.Pointer(&sqeMem[0])
	r.cqHead = (*uint32)(unsafe.Add(base, p.cqOff.head))
	r.cqTail = (*uint32)(unsafe.Add(base, p.cqOff.tail))
	r.cqMask = *(*uint32)(unsafe.Add(base, p.cqOff.ringMask))
	r.cqes = unsafe.Add(base, p.cqOff.cqes)
	return r, nil
}

// get returns the next free SQE (zeroed); it submits first when the queue
// is full.
func (r *ring) get() *sqe {
	tail := *r.sqTail
	if tail-atomic.LoadUint32(r.sqHead) >= r.sqEntries {
		r.enter(0)
		tail = *r.sqTail
	}
	idx := tail & r.sqMask
	s := (*sqe)(unsafe.Add(r.sqes, uintptr(idx)*unsafe.Sizeof(sqe{})))
	*s = sqe{}
	*(*uint32)(unsafe.Add(r.sqArray, uintptr(idx)*4)) = idx
	atomic.StoreUint32(r.sqTail, tail+1)
	r.pending++
	return s
}

// enter submits what is queued and waits for at least min completions.
func (r *ring) enter(min uint32) error {
	for {
		_, _, e := unix.Syscall6(sysIOUringEnter, uintptr(r.fd), uintptr(r.pending), uintptr(min), enterGetEvents, 0, 0)
		if e == unix.EINTR {
			continue
		}
		if e != 0 {
			return fmt.Errorf("io_uring_enter: %w", e)
		}
		r.pending = 0
		return nil
	}
}

// Provided buffers: one ring of pbufEntries buffers per loop, registered
// with the kernel; a multishot recv picks a buffer only when data arrives,
// so an idle connection holds none.
const (
	sysIOUringRegister = 427
	regPbufRing        = 22
	recvMultishot      = 1 << 1
	sqeBufferSelect    = 1 << 5
	cqeFBuffer         = 1 << 0
	pbufEntries        = 256
	errNoBufs          = -int32(unix.ENOBUFS)
)

type pbufRing struct {
	mem  []byte // the ring the kernel reads (page aligned, mmap)
	bufs []byte // pbufEntries buffers of bufSize
	tail uint16
}

func (r *ring) registerPbuf() (*pbufRing, error) {
	mem, err := unix.Mmap(-1, 0, pbufEntries*16, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	if err != nil {
		return nil, fmt.Errorf("mmap buffer ring: %w", err)
	}
	p := &pbufRing{mem: mem, bufs: make([]byte, pbufEntries*bufSize)}
	reg := struct {
		ringAddr    uint64
		ringEntries uint32
		bgid, flags uint16
		resv        [3]uint64
	}{ringAddr: uint64(uintptr(unsafe.Pointer(&mem[0]))), ringEntries: pbufEntries}
	if _, _, e := unix.Syscall6(sysIOUringRegister, uintptr(r.fd), regPbufRing, uintptr(unsafe.Pointer(&reg)), 1, 0, 0); e != 0 {
		return nil, fmt.Errorf("io_uring_register(PBUF_RING): %w", e)
	}
	for i := 0; i < pbufEntries; i++ {
		p.add(uint16(i))
	}
	p.publish()
	return p, nil
}

func (p *pbufRing) buf(bid uint16) []byte {
	return p.bufs[int(bid)*bufSize : (int(bid)+1)*bufSize]
}

// add queues buffer bid for the kernel; publish makes queued ones visible.
func (p *pbufRing) add(bid uint16) {
	e := unsafe.Pointer(&p.mem[int(p.tail&(pbufEntries-1))*16])
	*(*uint64)(e) = uint64(uintptr(unsafe.Pointer(&p.bufs[int(bid)*bufSize])))
	*(*uint32)(unsafe.Add(e, 8)) = bufSize
	*(*uint16)(unsafe.Add(e, 12)) = bid
	p.tail++
}

// publish stores the tail (the u16 at offset 14 of the ring) with release
// order, as one 32-bit store together with entry 0's bid.
func (p *pbufRing) publish() {
	w := (*uint32)(unsafe.Pointer(&p.mem[12]))
	atomic.StoreUint32(w, uint32(*(*uint16)(unsafe.Pointer(&p.mem[12])))|uint32(p.tail)<<16)
}

// user_data: kind in the top byte, the connection's generation in bits
// 32-55, its fd below (a late completion for a closed fd whose number was
// reused is recognised and dropped).
const (
	udAccept = 1 << 56
	udRecv   = 2 << 56
	udSend   = 3 << 56
	udWritev = 4 << 56
	udKind   = 0xff << 56
)

type chunk struct {
	bid int // provided buffer to return after the send, -1: none
	b   []byte
}

type uconn struct {
	fd, gen int
	kind    kind
	peer    *uconn
	armed   bool // a multishot recv is in flight
	left    int  // upstream: response bytes still expected, -1: head not parsed
	pend    []byte
	outq    []chunk // client: data to send, outq[0] in flight
	sending bool
	wbid    int    // upstream: buffer holding the head a writev sends
	wb      []byte // upstream: head copy when it did not arrive in one buffer
	iov     [2]unix.Iovec
}

type uloop struct {
	r        *ring
	pb       *pbufRing
	lfd      int
	upstream unix.Sockaddr
	conns    []*uconn
	idleUp   []*uconn
	starved  []*uconn // recv ended with ENOBUFS: rearm when a buffer returns
	gen      int
	xff      []byte
	p        parser
}

// runUring serves la on the calling goroutine, locked to its thread (the
// ring's only submitter under SINGLE_ISSUER); ready gets the setup error,
// or nil once the loop serves.
func runUring(la, ua netip.AddrPort, ready chan<- error) error {
	runtime.LockOSThread()
	l, err := newUloop(la, ua)
	ready <- err
	if err != nil {
		return err
	}
	return l.run()
}

func newUloop(la, ua netip.AddrPort) (*uloop, error) {
	r, err := newRing(1024)
	if err != nil {
		return nil, err
	}
	pb, err := r.registerPbuf()
	if err != nil {
		return nil, err
	}
	lfd, err := listenReuse(la)
	if err != nil {
		return nil, err
	}
	l := &uloop{r: r, pb: pb, lfd: lfd, upstream: sockaddr(ua), xff: []byte("X-Forwarded-For: 127.0.0.1\r\n\r\n"),
		p: parser{strict: strictParse}}
	l.armAccept()
	return l, nil
}

func (l *uloop) run() error {
	r := l.r
	for {
		if err := r.enter(1); err != nil {
			return err
		}
		head := atomic.LoadUint32(r.cqHead)
		tail := atomic.LoadUint32(r.cqTail)
		for ; head != tail; head++ {
			c := *(*cqe)(unsafe.Add(r.cqes, uintptr(head&r.cqMask)*unsafe.Sizeof(cqe{})))
			atomic.StoreUint32(r.cqHead, head+1)
			l.complete(c)
		}
		l.pb.publish()
	}
}

func (l *uloop) armAccept() {
	s := l.r.get()
	s.opcode, s.fd, s.ioprio, s.userData = opAccept, int32(l.lfd), acceptMultishot, udAccept
	s.opFlags = unix.SOCK_CLOEXEC
}

func listenReuse(la netip.AddrPort) (int, error) {
	lfd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("socket: %w", err)
	}
	unix.SetsockoptInt(lfd, unix.SOL_SOCKET, unix.SO_REUSEADDR, 1)
	unix.SetsockoptInt(lfd, unix.SOL_SOCKET, unix.SO_REUSEPORT, 1)
	if err := unix.Bind(lfd, sockaddr(la)); err != nil {
		return -1, fmt.Errorf("bind %s: %w", la, err)
	}
	if err := unix.Listen(lfd, 4096); err != nil {
		return -1, fmt.Errorf("listen: %w", err)
	}
	return lfd, nil
}

func (l *uloop) newConn(fd int, k kind) *uconn {
	l.gen = (l.gen + 1) & 0xffffff
	c := &uconn{fd: fd, gen: l.gen, kind: k, left: -1, wbid: -1}
	for fd >= len(l.conns) {
		l.conns = append(l.conns, make([]*uconn, len(l.conns)+64)...)
	}
	l.conns[fd] = c
	return c
}

func (c *uconn) ud(kind uint64) uint64 { return kind | uint64(c.gen)<<32 | uint64(uint32(c.fd)) }

func (l *uloop) arm(c *uconn) {
	if c.armed || c.fd < 0 {
		return
	}
	s := l.r.get()
	s.opcode, s.fd, s.ioprio, s.flags, s.userData = opRecv, int32(c.fd), recvMultishot, sqeBufferSelect, c.ud(udRecv)
	c.armed = true
}

func (l *uloop) recycle(bid int) {
	if bid < 0 {
		return
	}
	l.pb.add(uint16(bid))
	if n := len(l.starved); n > 0 {
		c := l.starved[n-1]
		l.starved = l.starved[:n-1]
		l.arm(c)
	}
}

func (l *uloop) closeConn(c *uconn) {
	if c.fd < 0 {
		return
	}
	l.conns[c.fd] = nil
	unix.Shutdown(c.fd, unix.SHUT_RDWR) // ends the multishot recv
	unix.Close(c.fd)
	c.fd = -1
	for _, ch := range c.outq {
		l.recycle(ch.bid)
	}
	c.outq = nil
	l.recycle(c.wbid)
	c.wbid = -1
	if p := c.peer; p != nil {
		c.peer, p.peer = nil, nil
		l.closeConn(p)
	}
}

func (l *uloop) complete(e cqe) {
	if e.userData == udAccept {
		if e.res >= 0 {
			unix.SetsockoptInt(int(e.res), unix.IPPROTO_TCP, unix.TCP_NODELAY, 1)
			l.arm(l.newConn(int(e.res), kClient))
		}
		if e.flags&cqeFMore == 0 {
			l.armAccept()
		}
		return
	}
	bid := -1
	if e.flags&cqeFBuffer != 0 {
		bid = int(e.flags >> 16)
	}
	fd, gen := int(uint32(e.userData)), int(e.userData>>32&0xffffff)
	var c *uconn
	if fd < len(l.conns) {
		c = l.conns[fd]
	}
	if c == nil || c.gen != gen {
		l.recycle(bid) // late completion of a closed connection
		return
	}
	switch e.userData & udKind {
	case udRecv:
		l.received(c, e, bid)
	case udSend:
		l.sendDone(c, e)
	case udWritev:
		l.recycle(c.wbid)
		c.wbid = -1
		if e.res < 0 {
			l.closeConn(c)
		}
	}
}

func (l *uloop) received(c *uconn, e cqe, bid int) {
	if e.flags&cqeFMore == 0 {
		c.armed = false
	}
	if e.res == errNoBufs {
		l.starved = append(l.starved, c)
		return
	}
	if e.res <= 0 {
		l.recycle(bid)
		l.closeConn(c)
		return
	}
	data := l.pb.buf(uint16(bid))[:e.res]
	if c.kind == kClient {
		l.clientData(c, data, bid)
	} else {
		l.upstreamData(c, data, bid)
	}
	if !c.armed && c.fd >= 0 {
		l.arm(c)
	}
}

func (l *uloop) clientData(c *uconn, data []byte, bid int) {
	if c.peer == nil && len(c.pend) == 0 {
		n := l.p.requestHead(data)
		if n < 0 {
			l.recycle(bid)
			l.closeConn(c)
			return
		}
		if n > 0 {
			if rest := data[n:]; len(rest) > 0 {
				c.pend = append(c.pend, rest...) // pipelined
			}
			l.forward(c, data[:n-2], bid)
			return
		}
	}
	c.pend = append(c.pend, data...)
	l.recycle(bid)
	l.tryPend(c)
}

// tryPend starts the request buffered in c.pend, if it is complete.
func (l *uloop) tryPend(c *uconn) {
	if c.peer != nil || c.fd < 0 {
		return
	}
	n := l.p.requestHead(c.pend)
	if n < 0 {
		l.closeConn(c)
		return
	}
	if n == 0 {
		if len(c.pend) == 0 {
			c.pend = nil // idle: no buffer
		}
		return
	}
	if u := l.forward(c, c.pend[:n-2], -1); u != nil {
		c.pend = append(c.pend[:0], c.pend[n:]...)
	}
}

// forward sends head (in provided buffer bid, or copied when bid < 0) and
// X-Forwarded-For to a pooled upstream connection.
func (l *uloop) forward(c *uconn, head []byte, bid int) *uconn {
	u, err := l.getUpstream()
	if err != nil {
		l.recycle(bid)
		l.closeConn(c)
		return nil
	}
	u.peer, c.peer = c, u
	u.left = -1
	s := l.r.get()
	if bid >= 0 {
		u.wbid = bid
		u.iov[0] = unix.Iovec{Base: &head[0]}
		u.iov[0].SetLen(len(head))
		u.iov[1] = unix.Iovec{Base: &l.xff[0]}
		u.iov[1].SetLen(len(l.xff))
		s.opcode, s.fd, s.userData = opWritev, int32(u.fd), u.ud(udWritev)
		s.addr, s.len = uint64(uintptr(unsafe.Pointer(&u.iov[0]))), 2
	} else {
		u.wb = append(append(u.wb[:0], head...), l.xff...)
		s.opcode, s.fd, s.userData = opSend, int32(u.fd), u.ud(udSend)
		s.addr, s.len = uint64(uintptr(unsafe.Pointer(&u.wb[0]))), uint32(len(u.wb))
		s.opFlags = unix.MSG_NOSIGNAL
	}
	return u
}

func (l *uloop) getUpstream() (*uconn, error) {
	if n := len(l.idleUp); n > 0 {
		u := l.idleUp[n-1]
		l.idleUp = l.idleUp[:n-1]
		return u, nil
	}
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	if err := unix.Connect(fd, l.upstream); err != nil {
		unix.Close(fd)
		return nil, err
	}
	unix.SetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_NODELAY, 1)
	u := l.newConn(fd, kUpstream)
	l.arm(u) // stays armed in the pool: bytes or EOF while idle discard it
	return u, nil
}

func (l *uloop) upstreamData(u *uconn, data []byte, bid int) {
	c := u.peer
	if c == nil || u.left == 0 {
		l.recycle(bid)
		l.closeConn(u) // readable while idle: stray bytes or a close
		return
	}
	if u.left < 0 {
		if len(u.pend) > 0 {
			// Head split across reads: continue on the gathered copy.
			u.pend = append(u.pend, data...)
			l.recycle(bid)
			data, bid = u.pend, -1
		}
		n := l.p.responseLen(data)
		if n == 0 {
			if bid >= 0 {
				u.pend = append(u.pend, data...)
				l.recycle(bid)
			}
			return
		}
		if n < 0 {
			l.recycle(bid)
			l.closeConn(u)
			return
		}
		u.left = n
		if bid < 0 {
			u.pend = nil // data keeps the copy until it is sent
		}
	}
	k := min(len(data), u.left)
	stray := len(data) > k
	u.left -= k
	l.queue(c, chunk{bid, data[:k]})
	if u.left == 0 {
		u.peer, c.peer = nil, nil
		if stray {
			l.closeConn(u)
		} else {
			l.idleUp = append(l.idleUp, u)
		}
		l.tryPend(c)
	}
}

func (l *uloop) queue(c *uconn, ch chunk) {
	c.outq = append(c.outq, ch)
	if !c.sending {
		l.sendHead(c)
	}
}

func (l *uloop) sendHead(c *uconn) {
	b := c.outq[0].b
	s := l.r.get()
	s.opcode, s.fd, s.userData = opSend, int32(c.fd), c.ud(udSend)
	s.addr, s.len = uint64(uintptr(unsafe.Pointer(&b[0]))), uint32(len(b))
	s.opFlags = unix.MSG_NOSIGNAL
	c.sending = true
}

func (l *uloop) sendDone(c *uconn, e cqe) {
	if e.res < 0 {
		l.closeConn(c)
		return
	}
	if c.kind == kUpstream {
		return // the copied head went out
	}
	c.sending = false
	ch := &c.outq[0]
	if int(e.res) < len(ch.b) {
		ch.b = ch.b[e.res:]
		l.sendHead(c)
		return
	}
	l.recycle(ch.bid)
	c.outq = c.outq[1:]
	if len(c.outq) > 0 {
		l.sendHead(c)
	} else {
		c.outq = nil
	}
}
