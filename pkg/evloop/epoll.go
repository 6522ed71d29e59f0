package evloop

import (
	"fmt"
	"unsafe"

	"golang.org/x/sys/unix"
)

// epoll is the edge-triggered epoll backend.
type epoll struct {
	l      *Loop
	epfd   int
	evfd   int
	parkfd int             // the park set (parkFD), closed by the parker
	parkEv unix.EpollEvent // the loop's set's interest in the park set
	rbuf   []byte          // the loop's scratch receive buffer
	events [256]unix.EpollEvent
	ts     unix.Timespec
	noNs   bool // epoll_pwait2 refused: millisecond timeouts
}

var eventfdOne = [8]byte{1}

func newEpoll(l *Loop) (*epoll, error) {
	epfd, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("epoll_create1: %w", err)
	}
	evfd, err := unix.Eventfd(0, unix.EFD_NONBLOCK|unix.EFD_CLOEXEC)
	if err != nil {
		unix.Close(epfd)
		return nil, fmt.Errorf("eventfd: %w", err)
	}
	e := &epoll{l: l, epfd: epfd, evfd: evfd, parkfd: -1, rbuf: make([]byte, l.bufSize)}
	// Edge-triggered: every write to the eventfd is a new edge, so the
	// counter is never read.
	if err := e.ctl(unix.EPOLL_CTL_ADD, evfd, unix.EPOLLIN|unix.EPOLLET, udWake); err != nil {
		e.close()
		return nil, fmt.Errorf("epoll_ctl eventfd: %w", err)
	}
	return e, nil
}

func (e *epoll) ctl(op, fd int, events uint32, ud uint64) error {
	ev := unix.EpollEvent{Events: events, Fd: int32(uint32(ud)), Pad: int32(uint32(ud >> 32))}
	return unix.EpollCtl(e.epfd, op, fd, &ev)
}

func (e *epoll) close() {
	unix.Close(e.evfd)
	unix.Close(e.epfd)
}

// parkFD is the parker's fd: a second epoll set (the park set) that
// holds only the loop's set, registered with interest in EPOLLIN while
// the loop parks and with none otherwise (before and after). The
// netpoller watches the park set, so it hears of the loop's events only
// while the loop is parked: with interest, each event in the loop's set
// wakes the park set's watchers (the netpoller's epoll_wait); without, the
// wake-up stops at the park set (the kernel reports no EPOLLIN to an item
// that asked for none). A loop waiting in epoll_pwait2 holding its P or
// running a turn then never wakes a thread blocked in the netpoller.
func (e *epoll) parkFD() (int, func() error, func(), error) {
	fd, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return -1, nil, nil, fmt.Errorf("epoll_create1 park set: %w", err)
	}
	ev := unix.EpollEvent{}
	if err := unix.EpollCtl(fd, unix.EPOLL_CTL_ADD, e.epfd, &ev); err != nil {
		unix.Close(fd)
		return -1, nil, nil, fmt.Errorf("add the loop's epoll set to the park set: %w", err)
	}
	e.parkfd = fd
	return fd, e.armPark, e.disarmPark, nil
}

// armPark gives the loop's set interest in the park set: from here its
// events wake the netpoller. A set that is readable already makes the
// park set readable at once (EPOLL_CTL_MOD polls the item).
func (e *epoll) armPark() error {
	e.parkEv.Events = unix.EPOLLIN
	if err := unix.EpollCtl(e.parkfd, unix.EPOLL_CTL_MOD, e.epfd, &e.parkEv); err != nil {
		return fmt.Errorf("arm the park set: %w", err)
	}
	return nil
}

// disarmPark takes the interest away when the park ends. A failure
// leaves it armed, which costs spurious netpoller wake-ups, not
// correctness: ignored.
func (e *epoll) disarmPark() {
	e.parkEv.Events = 0
	unix.EpollCtl(e.parkfd, unix.EPOLL_CTL_MOD, e.epfd, &e.parkEv)
}

func (e *epoll) wake() {
	unix.Write(e.evfd, eventfdOne[:])
}

func (e *epoll) poll(timeout int64) (bool, error) {
	n, err := e.wait(timeout)
	e.l.woke()
	if err == unix.EINTR {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("epoll_wait: %w", err)
	}
	l := e.l
	for i := 0; i < n; i++ {
		ev := &e.events[i]
		ud := uint64(uint32(ev.Fd)) | uint64(uint32(ev.Pad))<<32
		idx := uint32(ud)
		switch ud & udKind {
		case udSock:
			if s := l.lookup(idx, uint32(ud>>32)&0xffffff); s != nil {
				e.sockEvent(s, ev.Events)
			}
		case udListen:
			if int(idx) < len(l.listeners) && l.listeners[idx] != nil {
				e.accept(l.listeners[idx])
			}
		case udWatch:
			if w := l.watchFor(ud); w != nil {
				w.fn()
			}
		case udWake:
			l.nWakes.Add(1)
		}
	}
	return n > 0, nil
}

// wait is epoll_pwait2 (a timeout in ns, so timers are not rounded up
// to a millisecond), or epoll_wait where the kernel or seccomp refuses
// it. Both are announced (the scheduler may run others meanwhile) unless
// the loop waits in the kernel holding its P (kernelSpan: bounded).
func (e *epoll) wait(timeout int64) (int, error) {
	raw := e.l.inKernel.Load()
	if !e.noNs {
		var tsp unsafe.Pointer
		if timeout >= 0 {
			e.ts = unix.NsecToTimespec(timeout)
			tsp = unsafe.Pointer(&e.ts)
		}
		var n uintptr
		var errno unix.Errno
		if raw {
			n, _, errno = unix.RawSyscall6(unix.SYS_EPOLL_PWAIT2, uintptr(e.epfd), uintptr(unsafe.Pointer(&e.events[0])),
				uintptr(len(e.events)), uintptr(tsp), 0, 0)
		} else {
			n, _, errno = unix.Syscall6(unix.SYS_EPOLL_PWAIT2, uintptr(e.epfd), uintptr(unsafe.Pointer(&e.events[0])),
				uintptr(len(e.events)), uintptr(tsp), 0, 0)
		}
		switch errno {
		case 0:
			return int(n), nil
		case unix.ENOSYS, unix.EPERM:
			e.noNs = true
		default:
			return 0, errno
		}
	}
	ms := -1
	if timeout >= 0 {
		ms = int((timeout + 999_999) / 1_000_000)
	}
	if raw {
		n, _, errno := unix.RawSyscall6(unix.SYS_EPOLL_PWAIT, uintptr(e.epfd), uintptr(unsafe.Pointer(&e.events[0])),
			uintptr(len(e.events)), uintptr(ms), 0, 0)
		if errno != 0 {
			return 0, errno
		}
		return int(n), nil
	}
	return unix.EpollWait(e.epfd, e.events[:], ms)
}

func (e *epoll) accept(ln *listener) {
	for i := 0; i < 64 && !ln.gone; i++ {
		fd, remote, err := e.l.accept4(ln.fd)
		switch err {
		case nil:
			ln.h.OnAccept(e.l, fd, remote)
		case unix.EINTR, unix.ECONNABORTED:
		case unix.EAGAIN:
			return
		default:
			// EMFILE and friends: level-triggered, so leave the set and
			// retry later instead of spinning.
			e.ctl(unix.EPOLL_CTL_DEL, ln.fd, 0, 0)
			e.l.acceptFailed(ln, err)
			return
		}
	}
}

func (e *epoll) sockEvent(s *Sock, ev uint32) {
	if s.flags&fConnecting != 0 {
		if ev&(unix.EPOLLOUT|unix.EPOLLERR|unix.EPOLLHUP) == 0 || !s.connected() {
			return
		}
	}
	if ev&unix.EPOLLERR != 0 {
		if errno, err := unix.GetsockoptInt(s.fd, unix.SOL_SOCKET, unix.SO_ERROR); err == nil && errno != 0 {
			s.failNow(fmt.Errorf("evloop: %w", unix.Errno(errno)))
			return
		}
	}
	if ev&unix.EPOLLOUT != 0 && s.flags&fWBlocked != 0 {
		e.flush(s)
	}
	if sp := s.spl; sp != nil && ev&unix.EPOLLOUT != 0 && sp.dst == s {
		sp.ready(s, false)
	}
	if ev&(unix.EPOLLRDHUP|unix.EPOLLHUP) != 0 {
		s.flags |= fRdHup
	}
	if ev&(unix.EPOLLIN|unix.EPOLLRDHUP|unix.EPOLLHUP) != 0 {
		s.flags |= fReadable
		if sp := s.spl; sp != nil && sp.src == s {
			sp.ready(s, true)
			return
		}
		e.read(s)
	}
}

// read delivers what is readable, up to a few buffers (then the rest of
// the turn runs first).
func (e *epoll) read(s *Sock) {
	for i := 0; i < 8; i++ {
		if s.flags&(fClosed|fPaused|fEOF|fSplice) != 0 {
			return
		}
		n, err := rawRead(s.fd, e.rbuf)
		switch {
		case err == unix.EAGAIN:
			s.flags &^= fReadable
			return
		case err == unix.EINTR:
			continue
		case err != nil:
			s.failNow(fmt.Errorf("evloop: read: %w", err))
			return
		case n == 0:
			s.flags = s.flags&^fReadable | fEOF
			s.h.OnEOF(s)
			return
		}
		s.h.OnRead(s, e.rbuf[:n])
		if n < len(e.rbuf) && s.flags&fRdHup == 0 {
			// Drained: the next arrival raises a new edge.
			s.flags &^= fReadable
			return
		}
	}
	s.l.deferSock(s)
}

func (e *epoll) resumeRead(s *Sock) {
	if s.flags&fReadable != 0 {
		s.l.deferSock(s)
	}
}

func (e *epoll) readPending(s *Sock) { e.read(s) }

func (e *epoll) pauseRead(*Sock) {} // edge-triggered: bytes wait in the kernel

func (e *epoll) spliceWait(*Sock, bool) {} // edge-triggered: the next edge comes

func (e *epoll) write(s *Sock, bufs [][]byte) {
	if s.Pending() > 0 || s.flags&(fWBlocked|fConnecting) != 0 {
		s.queue(bufs, 0)
		s.flags |= fWBlocked
		return
	}
	for len(bufs) > 0 {
		k := min(len(bufs), 16)
		n, total, err := rawWritev(s.fd, bufs[:k])
		if err == unix.EAGAIN || err == unix.EINTR {
			n, err = 0, nil
		}
		if err != nil {
			s.failLater(fmt.Errorf("evloop: write: %w", err))
			return
		}
		if n < total {
			s.queue(bufs, n)
			s.flags |= fWBlocked // an EPOLLOUT edge follows once there is room
			return
		}
		bufs = bufs[k:]
	}
}

// flush writes the queue after EPOLLOUT.
func (e *epoll) flush(s *Sock) {
	for s.Pending() > 0 {
		n, err := rawWrite(s.fd, s.out[s.off:])
		switch err {
		case nil:
			s.wrote(n)
		case unix.EINTR:
		case unix.EAGAIN:
			return
		default:
			s.failNow(fmt.Errorf("evloop: write: %w", err))
			return
		}
	}
	s.flags &^= fWBlocked
	s.drained()
}

func (e *epoll) shutWrite(s *Sock) {
	s.flags |= fShutDone
	unix.Shutdown(s.fd, unix.SHUT_WR)
}

func (e *epoll) release(s *Sock) {
	if s.detach != nil && s.fd >= 0 {
		e.ctl(unix.EPOLL_CTL_DEL, s.fd, 0, 0)
	}
	s.l.finish(s)
}

func (e *epoll) add(s *Sock) error {
	return e.ctl(unix.EPOLL_CTL_ADD, s.fd, unix.EPOLLIN|unix.EPOLLOUT|unix.EPOLLRDHUP|unix.EPOLLET, s.ud(udSock))
}

func (e *epoll) listen(ln *listener) error {
	return e.ctl(unix.EPOLL_CTL_ADD, ln.fd, unix.EPOLLIN|unix.EPOLLEXCLUSIVE, udListen|uint64(ln.idx))
}

func (e *epoll) unlisten(ln *listener) { e.ctl(unix.EPOLL_CTL_DEL, ln.fd, 0, 0) }

func (e *epoll) watch(w *Watch) error {
	return e.ctl(unix.EPOLL_CTL_ADD, w.fd, unix.EPOLLIN|unix.EPOLLET, w.ud())
}

func (e *epoll) unwatch(w *Watch) { e.ctl(unix.EPOLL_CTL_DEL, w.fd, 0, 0) }

// Raw system calls for the non-blocking hot path: they never block, so
// the scheduler need not know.

func rawRead(fd int, b []byte) (int, error) {
	r, _, e := unix.RawSyscall(unix.SYS_READ, uintptr(fd), uintptr(unsafe.Pointer(&b[0])), uintptr(len(b)))
	if e != 0 {
		return 0, e
	}
	return int(r), nil
}

func rawWrite(fd int, b []byte) (int, error) {
	r, _, e := unix.RawSyscall(unix.SYS_WRITE, uintptr(fd), uintptr(unsafe.Pointer(&b[0])), uintptr(len(b)))
	if e != 0 {
		return 0, e
	}
	return int(r), nil
}

// rawWritev writes up to 16 buffers; total is their length.
func rawWritev(fd int, bufs [][]byte) (n, total int, err error) {
	var iov [16]unix.Iovec
	k := 0
	for _, b := range bufs {
		if len(b) == 0 {
			continue
		}
		iov[k].Base = &b[0]
		iov[k].SetLen(len(b))
		total += len(b)
		k++
	}
	if k == 0 {
		return 0, 0, nil
	}
	r, _, e := unix.RawSyscall(unix.SYS_WRITEV, uintptr(fd), uintptr(unsafe.Pointer(&iov[0])), uintptr(k))
	if e != 0 {
		return 0, total, e
	}
	return int(r), total, nil
}
