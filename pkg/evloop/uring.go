package evloop

import (
	"fmt"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"
)

// uring is the io_uring backend: one ring per loop, multishot recv
// (provided buffers), listeners through an epoll set the ring polls, sends of the bytes a turn queued, POLL_ADD for
// Watch and connects, a READ on an eventfd for Post, async cancel for
// Close/Detach/PauseRead, and one io_uring_enter per turn.
type uring struct {
	l       *Loop
	r       *ring
	pb      *pbufRing
	evfd    int
	parkfd  int    // the parker's eventfd, or -1 (BlockingWait)
	page    []byte // mmap'd: the eventfd READ's target
	sendq   []*Sock
	starved []*Sock

	// recvLimit bounds what one multishot recv takes before it ends and
	// is re-armed (bytes, IORING_RECV_MSHOT_LIM through sqe->optlen), so
	// what a socket's recv took when its handler paused is bounded; 0
	// once the kernel refused the limit (EINVAL: older kernels).
	recvLimit int

	// Listening sockets are not given to the ring: a request in flight on
	// a file pins it until the ring is torn down, which after the
	// process dies (kill -9) runs later on a kernel worker, so a steered
	// listener would stay in the sockmap and take (then reset)
	// connections meant for the fallback. An epoll set does not pin
	// them: the ring polls the set, the loop accepts with accept4.
	lep int // epoll set of the listeners (0: none yet)
	lev [64]unix.EpollEvent

	// A span of kernel waits (kernelSpan) ends with one TIMEOUT
	// submission, not with a timeout on each wait: an enter's timeout
	// arms a kernel timer and cancels it on wake-up, and a timer due
	// within a millisecond is the CPU's next event, so each of those
	// reprograms the timer device (on a virtual machine two exits
	// of several µs per wait, all on the request's path at one request
	// at a time: docs/bench/evloop.md).
	spanAt  int64         // end of the span the pending TIMEOUT was armed for, loop clock; 0: none pending
	spanSeq uint32        // sequence of the latest TIMEOUT (user data's low bits)
	spanTS  unix.Timespec // its relative expiry, read by the kernel at submission
	nSpans  atomic.Uint64 // TIMEOUTs armed (tests)
	nEnds   atomic.Uint64 // TIMEOUTs completed (tests)
	spanOff bool          // the kernel refused a TIMEOUT: waits bound themselves
}

// udListenSet marks the POLL_ADD on the listeners' epoll set.
const udListenSet = udListen | 0xffffffff

// recvBurst is how many receive buffers' worth one multishot recv may
// take before it is re-armed: the most a paused socket keeps stashed.
const recvBurst = 4

// refuseSpanTimeout (tests) makes the kernel refuse the span's TIMEOUT.
var refuseSpanTimeout bool

// refuseRecvLimit (tests) makes the kernel refuse the first limited recv
// as a kernel without the limit does.
var refuseRecvLimit bool

// pbufEntries is the number of provided receive buffers per loop (a
// power of two; a variable so that a test can make the ring run dry).
var pbufEntries uint16 = 256

const (
	sqEntries = 1024
	cqEntries = 8192
	udPollOut = udConn // POLL_ADD POLLOUT: connect done, or room to send again
)

func newUring(l *Loop) (*uring, error) {
	if uringSetupHook != nil {
		if err := uringSetupHook(); err != nil {
			return nil, err
		}
	}
	r, err := newRing(sqEntries, cqEntries)
	if err != nil {
		return nil, err
	}
	pb, err := r.registerPbuf(pbufEntries, l.bufSize)
	if err != nil {
		r.close()
		return nil, err
	}
	page, err := unix.Mmap(-1, 0, 4096, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	if err != nil {
		pb.close()
		r.close()
		return nil, fmt.Errorf("mmap: %w", err)
	}
	evfd, err := unix.Eventfd(0, unix.EFD_CLOEXEC)
	if err != nil {
		unix.Munmap(page)
		pb.close()
		r.close()
		return nil, fmt.Errorf("eventfd: %w", err)
	}
	u := &uring{l: l, r: r, pb: pb, evfd: evfd, parkfd: -1, page: page, recvLimit: recvBurst * l.bufSize}
	u.armWake()
	return u, nil
}

// armSpan makes sure a TIMEOUT ends the loop's wait by until (loop
// clock, now is the clock): it arms one unless one is pending, which
// then ends a wait no later (until only grows); it goes with the wait's
// own enter. False when the kernel refused one: the wait needs its own
// timeout.
func (u *uring) armSpan(until, now int64) bool {
	if u.spanOff {
		return false
	}
	if u.spanAt != 0 {
		return true
	}
	u.spanSeq++
	u.spanAt = until
	u.spanTS = unix.NsecToTimespec(until - now)
	q := u.r.get()
	q.opcode, q.fd, q.userData = opTimeout, -1, udSpan|uint64(u.spanSeq)
	q.addr, q.len = uint64(uintptr(unsafe.Pointer(&u.spanTS))), 1
	if refuseSpanTimeout {
		q.len = 2 // EINVAL
	}
	u.nSpans.Add(1)
	return true
}

func (u *uring) armWake() {
	q := u.r.get()
	q.opcode, q.fd, q.userData = opRead, int32(u.evfd), udWake
	q.addr, q.len = uint64(uintptr(unsafe.Pointer(&u.page[0]))), 8
}

// parkFD is an eventfd registered with the ring, for the parker. The
// ring's completion work is task work of the loop thread, which the
// kernel wakes even while it sleeps parked in the Go runtime (ringFlags):
// the thread posts the completions and signals this eventfd at once,
// and the netpoller hands the loop goroutine its P back. It is signalled
// only while the loop parks (IORING_CQ_EVENTFD_DISABLED otherwise), so a
// busy loop does not wake the netpoller.
func (u *uring) parkFD() (int, func() error, func(), error) {
	fd, err := unix.Eventfd(0, unix.EFD_NONBLOCK|unix.EFD_CLOEXEC)
	if err != nil {
		return -1, nil, nil, fmt.Errorf("eventfd: %w", err)
	}
	if err := u.r.registerEventfd(fd); err != nil {
		unix.Close(fd)
		return -1, nil, nil, err
	}
	u.r.eventfdEnabled(false)
	u.parkfd = fd
	return fd, func() error { u.r.eventfdEnabled(true); return nil }, func() { u.r.eventfdEnabled(false) }, nil
}

// wake ends the loop's wait: a parked loop through the parker's eventfd
// (a READ of the wake eventfd completing in an io-wq worker does not
// always signal the ring's registered eventfd), a loop blocked in
// io_uring_enter through the READ on the wake eventfd.
func (u *uring) wake() {
	if u.parkfd >= 0 && !u.l.inKernel.Load() {
		unix.Write(u.parkfd, eventfdOne[:])
		return
	}
	unix.Write(u.evfd, eventfdOne[:])
}

// close ends the sockets still waiting for completions (Group.Close),
// then the ring. Buffers the kernel writes are mmap'd, not Go memory.
func (u *uring) close() {
	for _, s := range u.l.socks {
		if s != nil {
			if s.detach == nil {
				unix.Shutdown(s.fd, unix.SHUT_RDWR)
			}
			s.inflight = 0
			s.releaseSendBuf()
			u.l.finish(s)
		}
	}
	u.r.close()
	u.pb.close()
	unix.Munmap(u.page)
	unix.Close(u.evfd)
	if u.lep > 0 {
		unix.Close(u.lep)
	}
}

func (u *uring) poll(timeout int64) (bool, error) {
	u.flushSends()
	err := u.r.enter(timeout, u.l.inKernel.Load())
	u.l.woke()
	if err != nil {
		return false, err
	}
	r := u.r
	head := *r.cqHead
	tail := atomic.LoadUint32(r.cqTail)
	got := head != tail || r.pending()
	for ; head != tail; head++ {
		c := *r.peek(head)
		atomic.StoreUint32(r.cqHead, head+1)
		u.complete(c)
	}
	if u.pb.added > 0 {
		u.pb.publish()
		u.rearmStarved()
	}
	return got, nil
}

func (u *uring) complete(c cqe) {
	l := u.l
	idx := uint32(c.userData)
	switch c.userData & udKind {
	case udWake:
		l.nWakes.Add(1)
		u.armWake()
	case udSpan:
		u.nEnds.Add(1)
		if uint32(c.userData) == u.spanSeq {
			u.spanAt = 0
		}
		if e := unix.Errno(-c.res); c.res < 0 && e != unix.ETIME && e != unix.ECANCELED && !u.spanOff {
			// Refused: each wait would arm another at once. Waits go
			// back to a timeout of their own.
			u.spanOff = true
			l.log.Warn("evloop: io_uring TIMEOUT refused; kernel waits arm their own timeout", "loop", l.id, "err", e)
		}
	case udListen:
		u.listenReady(c)
	case udWatch:
		if w := l.watchFor(c.userData); w != nil {
			w.fn()
			if c.flags&cqeFMore == 0 && !w.stopped {
				u.armWatch(w)
			}
		}
	case udSock, udSend, udPollOut, udPollIn:
		s := l.lookup(idx, uint32(c.userData>>32)&0xffffff)
		if s == nil {
			if c.flags&cqeFBuffer != 0 {
				u.pb.add(uint16(c.flags >> 16))
			}
			return
		}
		switch c.userData & udKind {
		case udSock:
			u.recvDone(s, c)
		case udSend:
			u.sendDone(s, c)
		case udPollIn:
			u.pollInDone(s)
		default:
			u.pollOutDone(s, c)
		}
	}
}

func (u *uring) listen(ln *listener) error {
	if u.lep == 0 {
		fd, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
		if err != nil {
			return fmt.Errorf("epoll_create1: %w", err)
		}
		u.lep = fd
		u.armListenSet()
	}
	ev := unix.EpollEvent{Events: unix.EPOLLIN | unix.EPOLLEXCLUSIVE, Fd: int32(ln.idx)}
	return unix.EpollCtl(u.lep, unix.EPOLL_CTL_ADD, ln.fd, &ev)
}

func (u *uring) armListenSet() {
	q := u.r.get()
	q.opcode, q.fd, q.len, q.opFlags = opPollAdd, int32(u.lep), pollAddMulti, pollIn
	q.userData = udListenSet
}

// listenReady accepts on every ready listener until it would block.
func (u *uring) listenReady(c cqe) {
	l := u.l
	n, _ := unix.EpollWait(u.lep, u.lev[:], 0)
	for i := 0; i < n; i++ {
		idx := int(u.lev[i].Fd)
		if idx < len(l.listeners) && l.listeners[idx] != nil {
			u.accept(l.listeners[idx])
		}
	}
	if c.flags&cqeFMore == 0 {
		u.armListenSet()
	}
}

func (u *uring) accept(ln *listener) {
	for !ln.gone {
		fd, remote, err := u.l.accept4(ln.fd)
		switch err {
		case nil:
			ln.h.OnAccept(u.l, fd, remote)
		case unix.EINTR, unix.ECONNABORTED:
		case unix.EAGAIN:
			return
		default:
			// EMFILE and friends: leave the set and retry later.
			unix.EpollCtl(u.lep, unix.EPOLL_CTL_DEL, ln.fd, nil)
			u.l.acceptFailed(ln, err)
			return
		}
	}
}

func (u *uring) unlisten(ln *listener) { unix.EpollCtl(u.lep, unix.EPOLL_CTL_DEL, ln.fd, nil) }

// cancel queues an async cancel of the request with user data ud, or of
// every request on fd when fd >= 0.
func (u *uring) cancel(ud uint64, fd int) {
	q := u.r.get()
	q.opcode, q.userData = opAsyncCancel, udCancel
	if fd >= 0 {
		q.fd, q.opFlags = int32(fd), cancelFD|cancelAll
	} else {
		q.addr = ud
	}
}

func (u *uring) watch(w *Watch) error {
	u.armWatch(w)
	return nil
}

func (u *uring) armWatch(w *Watch) {
	q := u.r.get()
	q.opcode, q.fd, q.len, q.opFlags = opPollAdd, int32(w.fd), pollAddMulti, pollIn
	q.userData = w.ud()
}

func (u *uring) unwatch(w *Watch) { u.cancel(w.ud(), -1) }

func (u *uring) add(s *Sock) error {
	// A multishot recv on an AF_UNIX stream socket can miss the peer's
	// shutdown (after a short read the kernel waits for a wakeup that came
	// already): those sockets get a single-shot recv per arrival.
	if d, err := unix.GetsockoptInt(s.fd, unix.SOL_SOCKET, unix.SO_DOMAIN); err == nil && d == unix.AF_UNIX {
		s.flags |= fOneShot
	}
	if s.flags&fConnecting != 0 {
		u.pollOut(s)
	} else {
		u.arm(s)
	}
	return nil
}

func (u *uring) pollOut(s *Sock) {
	q := u.r.get()
	q.opcode, q.fd, q.opFlags, q.userData = opPollAdd, int32(s.fd), pollOut, s.ud(udPollOut)
	s.inflight++
}

func (u *uring) pollOutDone(s *Sock, c cqe) {
	s.inflight--
	if u.opDone(s) {
		return
	}
	if s.flags&fConnecting != 0 {
		if !s.connected() {
			return
		}
		u.arm(s)
	}
	if s.Pending() > 0 && !s.isSending() {
		u.send(s)
	}
	if sp := s.spl; sp != nil {
		sp.ready(s, false)
	}
}

// spliceWait polls s for what its splice waits for: bytes to read (in)
// or room to write.
func (u *uring) spliceWait(s *Sock, in bool) {
	if !in {
		u.pollOut(s)
		return
	}
	q := u.r.get()
	q.opcode, q.fd, q.opFlags, q.userData = opPollAdd, int32(s.fd), pollIn, s.ud(udPollIn)
	s.inflight++
}

func (u *uring) pollInDone(s *Sock) {
	s.inflight--
	if u.opDone(s) {
		return
	}
	if sp := s.spl; sp != nil {
		sp.ready(s, true)
	}
}

// opDone finishes a released socket once nothing is in flight; it
// reports whether s is being released.
func (u *uring) opDone(s *Sock) bool {
	if s.flags&fRelease == 0 {
		return false
	}
	if s.inflight == 0 {
		u.l.finish(s)
	}
	return true
}

// arm starts the socket's multishot recv unless it runs, reading is
// paused or over, or stashed bytes wait (readPending arms once they are
// delivered: a paused socket's stash is what one recv took, at most
// recvLimit).
func (u *uring) arm(s *Sock) {
	if s.flags&(fArmed|fClosed|fPaused|fEOF|fRdHup|fConnecting|fSplice) != 0 || s.err != nil || len(s.stash) > 0 {
		return
	}
	q := u.r.get()
	q.opcode, q.fd, q.ioprio, q.flags = opRecv, int32(s.fd), recvMultishot, sqeBufferSelect
	switch {
	case s.flags&fOneShot != 0:
		q.ioprio = 0
	case u.recvLimit > 0:
		q.spliceIn = int32(u.recvLimit) // optlen: the recv's total limit
		if refuseRecvLimit {
			refuseRecvLimit = false
			q.opFlags = unix.MSG_WAITALL // a multishot recv refuses it: EINVAL
		}
	}
	q.userData = s.ud(udSock)
	s.flags = s.flags&^(fStarved|fRecvCancel) | fArmed
	s.inflight++
}

func (u *uring) recvDone(s *Sock, c cqe) {
	more := c.flags&cqeFMore != 0
	if !more {
		s.flags &^= fArmed | fRecvCancel
		s.inflight--
	}
	switch {
	case c.res > 0:
		bid := uint16(c.flags >> 16)
		data := u.pb.buf(bid)[:c.res]
		if s.flags&(fPaused|fClosed|fSplice) != 0 || len(s.stash) > 0 {
			if s.flags&fRelease == 0 || s.detach != nil {
				s.keep(data)
			}
		} else {
			s.h.OnRead(s, data)
		}
		u.pb.add(bid)
	case c.res == 0:
		s.flags |= fRdHup // EOF, delivered after what is stashed
		if s.flags&(fPaused|fClosed|fSplice) == 0 && len(s.stash) == 0 {
			s.flags |= fEOF
			s.h.OnEOF(s)
		}
	case c.res == -int32(unix.ENOBUFS):
		u.l.nStarved.Add(1)
		if s.flags&fStarved == 0 {
			s.flags |= fStarved
			u.starved = append(u.starved, s)
		}
	case c.res == -int32(unix.ECANCELED), c.res == -int32(unix.EAGAIN), c.res == -int32(unix.EINTR):
	case c.res == -int32(unix.EINVAL) && u.recvLimit > 0 && s.flags&fOneShot == 0:
		// A kernel without the multishot recv limit: read on without it
		// (re-armed below).
		u.recvLimit = 0
		u.l.log.Info("evloop: io_uring recv has no total limit on this kernel; a paused socket may stash more than one receive burst")
	default:
		s.failNow(fmt.Errorf("evloop: recv: %w", unix.Errno(-c.res)))
	}
	if !more && !u.opDone(s) {
		u.recvEnded(s)
	}
}

// recvEnded: s's recv is over (a single shot, a cancel, a limit, or no
// buffer left). A splice waiting for that starts, also when the recv
// starved; otherwise reading goes on, once buffers are back if it
// starved (rearmStarved).
func (u *uring) recvEnded(s *Sock) {
	switch {
	case s.flags&fSplice != 0:
		s.l.deferSock(s)
	case s.flags&fStarved == 0:
		u.arm(s)
	}
}

// keep stashes bytes received while reading is paused (or the socket
// detaches, or stashed bytes wait): PauseRead cancels the recv at once
// and no recv is armed while a stash waits, so that is at most what one
// recv takes (recvLimit). The stash is a write-queue buffer of the
// loop's (getBuf), kept at its array's start, so it goes back to the
// loop's free lists: a splice starts with one on every large response.
func (s *Sock) keep(b []byte) {
	l := s.l
	switch {
	case s.stash == nil:
		s.stash = l.getBuf(len(b))
	case len(s.stash)+len(b) > cap(s.stash):
		nb := append(l.getBuf(len(s.stash)+len(b)), s.stash...)
		l.putBuf(s.stash)
		s.stash = nb
	}
	s.stash = append(s.stash, b...)
}

func (u *uring) rearmStarved() {
	for i, s := range u.starved {
		u.starved[i] = nil
		s.flags &^= fStarved
		if s.fd >= 0 {
			u.arm(s)
		}
	}
	u.starved = u.starved[:0]
}

// pauseRead cancels the socket's recv at once rather than with the
// turn's enter: until the kernel sees the cancel, every arrival takes
// another provided buffer that ends in the stash.
func (u *uring) pauseRead(s *Sock) {
	if s.flags&(fArmed|fRecvCancel) == fArmed {
		s.flags |= fRecvCancel
		u.cancel(s.ud(udSock), -1)
		u.r.submit()
	}
}

func (u *uring) resumeRead(s *Sock) {
	if len(s.stash) > 0 || s.flags&(fRdHup|fEOF) == fRdHup {
		s.flags |= fReadable
		s.l.deferSock(s)
		return
	}
	u.arm(s)
}

// readPending delivers what was stashed while paused, in pieces of at
// most BufSize, until the handler pauses again (the rest stays stashed
// for the next ResumeRead), then the EOF, then reads on.
func (u *uring) readPending(s *Sock) {
	s.flags &^= fReadable
	for len(s.stash) > 0 && s.flags&(fClosed|fPaused|fSplice) == 0 {
		b := s.stash
		n := min(len(b), u.l.bufSize)
		u.l.lent = b // not back to the free lists while OnRead reads it
		s.h.OnRead(s, b[:n])
		u.l.lent = nil
		if s.stash != nil && unsafe.SliceData(s.stash) == unsafe.SliceData(b) {
			s.consumeStash(n) // the rest is what Unread returns if the handler detached
		}
	}
	if s.flags&(fClosed|fPaused|fSplice) != 0 {
		return
	}
	if s.flags&(fRdHup|fEOF) == fRdHup {
		s.flags |= fEOF
		s.h.OnEOF(s)
		return
	}
	u.arm(s)
}

func (u *uring) write(s *Sock, bufs [][]byte) {
	s.queue(bufs, 0)
	if !s.isSending() && s.flags&fSendQ == 0 && s.Pending() > 0 {
		s.flags |= fSendQ
		u.sendq = append(u.sendq, s)
	}
}

// flushSends submits one send per socket with bytes queued this turn.
func (u *uring) flushSends() {
	for i, s := range u.sendq {
		u.sendq[i] = nil
		s.flags &^= fSendQ
		if s.fd >= 0 && s.flags&(fRelease|fConnecting) == 0 && !s.isSending() && s.Pending() > 0 {
			u.send(s)
		}
	}
	u.sendq = u.sendq[:0]
}

func (u *uring) send(s *Sock) {
	b := s.out[s.off:]
	q := u.r.get()
	q.opcode, q.fd, q.userData = opSend, int32(s.fd), s.ud(udSend)
	q.addr, q.len, q.opFlags = uint64(uintptr(unsafe.Pointer(&b[0]))), uint32(len(b)), unix.MSG_NOSIGNAL
	s.sendBuf = s.out // in flight; the array stays alive while the kernel reads it
	s.inflight++
}

func (u *uring) sendDone(s *Sock, c cqe) {
	s.releaseSendBuf()
	s.inflight--
	if u.opDone(s) {
		return
	}
	switch {
	case c.res >= 0:
		if s.wrote(int(c.res)) {
			s.drained()
		} else {
			u.send(s)
		}
	case c.res == -int32(unix.EAGAIN), c.res == -int32(unix.EINTR):
		u.pollOut(s) // send again once there is room
	default:
		s.failNow(fmt.Errorf("evloop: send: %w", unix.Errno(-c.res)))
	}
}

func (u *uring) shutWrite(s *Sock) {
	s.flags |= fShutDone
	unix.Shutdown(s.fd, unix.SHUT_WR)
}

// release cancels what is in flight on s; the last completion finishes
// it.
func (u *uring) release(s *Sock) {
	s.flags |= fRelease
	if s.inflight == 0 {
		u.l.finish(s)
		return
	}
	if s.flags&fCancel == 0 {
		s.flags |= fCancel
		u.cancel(0, s.fd)
	}
}
