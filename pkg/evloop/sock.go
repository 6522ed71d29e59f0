package evloop

import (
	"fmt"
	"net/netip"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// AcceptHandler gets the connections a listener accepted. fd is
// non-blocking and close-on-exec; the handler owns it (Add it, or close
// it). remote may be nil when the peer's address is unknown.
type AcceptHandler interface {
	OnAccept(l *Loop, fd int, remote netip.AddrPort)
}

// Handler gets a socket's events, on the loop thread. It must not block.
type Handler interface {
	// OnConnect reports the end of Connect; on err the loop closes s after
	// OnConnect returns.
	OnConnect(s *Sock, err error)
	// OnRead gets received bytes; b is valid only during the call.
	OnRead(s *Sock, b []byte)
	// OnEOF: the peer shut its write side. s stays open for writing; no
	// more OnRead comes.
	OnEOF(s *Sock)
	// OnError: the connection failed (reset, failed write...). The loop
	// closes s after OnError returns.
	OnError(s *Sock, err error)
	// OnDrained: Pending went from > 0 to 0.
	OnDrained(s *Sock)
}

// Sock is a connected socket owned by a loop. Its methods must be called
// on the loop thread.
type Sock struct {
	l     *Loop
	h     Handler
	data  any
	fd    int
	slot  uint32
	gen   uint32
	flags uint32
	// io_uring: submissions whose last completion has not come (here, in
	// what would be padding: the struct's size is an idle connection's)
	inflight int32
	out      []byte // queued bytes: out[off:] not yet handed to the kernel
	off      int
	err      error
	detach   func(fd int, err error)
	spl      *splice // the splice s is the source or destination of

	// io_uring state
	sendBuf []byte // a send of queued bytes is in flight: the array it reads, kept alive
	stash   []byte // received while paused, before the recv ended
}

const (
	fClosed      = 1 << iota // Close, Detach or failed: no more handler calls
	fDetach                  // Detach: release once drained
	fPaused                  // PauseRead
	fEOF                     // read side ended
	fShutWr                  // CloseWrite called
	fShutDone                // shutdown(SHUT_WR) done
	fConnecting              // Connect in progress
	fWBlocked                // epoll: waiting for EPOLLOUT
	fReadable                // unread data may wait (paused, or a long burst)
	fRdHup                   // epoll: the peer's FIN is queued
	fLater                   // in l.later
	fArmed                   // io_uring: a multishot recv is in flight
	fStarved                 // io_uring: recv ended for lack of buffers
	fConnected               // OnConnect(nil) to deliver
	fRelease                 // io_uring: closing or detaching, waits for completions
	fCancel                  // io_uring: cancel of everything on the fd queued
	fRecvCancel              // io_uring: cancel of the recv queued
	fSendQ                   // io_uring: in the turn's send queue
	fUnreadTaken             // the Detach callback called Unread
	fOneShot                 // io_uring: single-shot recv (not TCP, see uring.add)
	fSplice                  // the source of a splice: it reads, not the driver
)

// FD returns the socket's file descriptor (-1 once released).
func (s *Sock) FD() int { return s.fd }

// Loop returns the loop owning s.
func (s *Sock) Loop() *Loop { return s.l }

// SetData stores the handler's per-socket state.
func (s *Sock) SetData(v any) { s.data = v }

// Data returns what SetData stored.
func (s *Sock) Data() any { return s.data }

// Pending returns the bytes queued by Write and not yet handed to the
// kernel.
func (s *Sock) Pending() int { return len(s.out) - s.off }

// Write queues bufs for sending, in order; it never blocks. Writes after
// Close, Detach or CloseWrite are dropped. A failure is reported to
// OnError later in the turn, not from inside Write.
func (s *Sock) Write(bufs ...[]byte) {
	if s.flags&(fClosed|fShutWr) != 0 || s.err != nil {
		return
	}
	// Concrete calls, not the driver interface: bufs must not escape
	// (the variadic slice then stays on the caller's stack).
	if u := s.l.ur; u != nil {
		u.write(s, bufs)
	} else {
		s.l.ep.write(s, bufs)
	}
}

// PauseRead stops OnRead and OnEOF until ResumeRead. Bytes that arrive
// meanwhile stay in the kernel. User space holds at most what was
// received before the pause took effect: nothing with epoll; with
// io_uring what the socket's recv took (at most 4 x BufSize, see the
// package doc), kept for ResumeRead.
func (s *Sock) PauseRead() {
	if s.flags&(fClosed|fPaused) != 0 {
		return
	}
	s.flags |= fPaused
	if s.flags&fSplice == 0 {
		s.l.drv.pauseRead(s)
	}
}

// ResumeRead undoes PauseRead; data already waiting is delivered later in
// this turn, at most BufSize per OnRead, until the handler pauses again.
func (s *Sock) ResumeRead() {
	if s.flags&fClosed != 0 || s.flags&fPaused == 0 {
		return
	}
	s.flags &^= fPaused
	if s.flags&fSplice == 0 {
		s.l.drv.resumeRead(s)
	}
}

// CloseWrite shuts the write side down once the queued bytes are written.
func (s *Sock) CloseWrite() {
	if s.flags&(fClosed|fShutWr) != 0 {
		return
	}
	s.flags |= fShutWr
	// Not while connecting: shutdown on a socket in SYN_SENT disconnects
	// it. connected() shuts it once the connect is done.
	if s.Pending() == 0 && !s.isSending() && s.flags&fConnecting == 0 {
		s.l.drv.shutWrite(s)
	}
}

// Close ends s: no more callbacks, unwritten bytes are dropped, the fd is
// closed once no operation is in flight on it.
func (s *Sock) Close() {
	if s.flags&fClosed != 0 {
		return
	}
	s.flags |= fClosed
	if s.spl != nil {
		s.spl.detach(s)
	}
	s.l.drv.release(s)
}

// Detach takes s out of its loop without closing the fd: no more handler
// calls; fn runs on the loop thread once the queued bytes reached the
// kernel and no operation is in flight, with the (non-blocking) fd, or
// with -1 and the error when a queued write failed.
func (s *Sock) Detach(fn func(fd int, err error)) {
	if s.flags&fClosed != 0 {
		return
	}
	s.flags |= fClosed | fDetach
	s.detach = fn
	if s.spl != nil {
		s.spl.detach(s)
	}
	s.l.drv.pauseRead(s)
	s.l.deferSock(s)
}

// Unread returns the bytes the loop received for s and had not delivered
// when a Detach completed (io_uring only: a multishot recv may take bytes
// before its cancel); call it from the Detach callback, which owns them.
func (s *Sock) Unread() []byte {
	s.flags |= fUnreadTaken
	return s.stash
}

// deferred runs s's deferred work (Loop.runLater).
func (s *Sock) deferred() {
	if s.flags&fDetach != 0 {
		if s.slot < uint32(len(s.l.socks)) && s.l.socks[s.slot] == s && (s.Pending() == 0 || s.err != nil) && !s.isSending() {
			s.l.drv.release(s)
		}
		return
	}
	if s.flags&fClosed != 0 {
		return
	}
	if s.flags&fConnected != 0 {
		s.flags &^= fConnected
		s.h.OnConnect(s, nil)
	}
	if s.err != nil {
		s.failNow(s.err)
		return
	}
	if sp := s.spl; sp != nil && sp.src == s {
		sp.pump()
		return
	}
	if s.flags&(fReadable|fPaused) == fReadable {
		s.l.drv.readPending(s)
	}
}

// failNow reports err to the handler and closes s; drivers call it while
// dispatching, never from inside a handler's call into the package.
func (s *Sock) failNow(err error) {
	if s.flags&fClosed != 0 {
		if s.flags&fDetach != 0 && s.err == nil {
			s.err = err
			s.l.deferSock(s)
		}
		return
	}
	s.err = err
	s.h.OnError(s, err)
	s.Close()
}

// failLater records err for delivery in runLater (from inside Write).
func (s *Sock) failLater(err error) {
	if s.err == nil {
		s.err = err
	}
	s.l.deferSock(s)
}

// queue copies bufs (after skipping skip bytes) behind the queued bytes.
func (s *Sock) queue(bufs [][]byte, skip int) {
	n := -skip
	for _, b := range bufs {
		n += len(b)
	}
	if n <= 0 {
		return
	}
	s.reserve(n)
	for _, b := range bufs {
		if skip >= len(b) {
			skip -= len(b)
			continue
		}
		s.out = append(s.out, b[skip:]...)
		skip = 0
	}
}

// reserve makes room for n more queued bytes. The array never grows in
// place: the unsent bytes move to its front when no send reads it, else
// into a larger pooled buffer, so the queue holds about what is unsent
// rather than everything written since it last drained (a stream whose
// reader keeps up but never lets the queue empty grew it by the whole
// body: 630 MB of RSS for a 256 MiB download).
func (s *Sock) reserve(n int) {
	if s.out == nil {
		s.out = s.l.getBuf(n)
		return
	}
	if len(s.out)+n <= cap(s.out) {
		return
	}
	pend := len(s.out) - s.off
	busy := s.outSending()
	if !busy && pend+n <= cap(s.out) {
		copy(s.out, s.out[s.off:])
		s.out, s.off = s.out[:pend], 0
		return
	}
	// The smallest class that holds the unsent bytes: rounding up to a
	// class leaves the headroom (a queue that outgrows it moves up a
	// class, so moves stay rare), and a connection whose client is slow
	// holds one buffer of about loopMaxPending's class, plus the one a
	// send still reads.
	nb := append(s.l.getBuf(pend+n), s.out[s.off:]...)
	if !busy {
		s.l.putBuf(s.out)
	} // else the send's completion returns it (releaseSendBuf)
	s.out, s.off = nb, 0
}

// outSending reports whether an in-flight send reads s.out's array.
func (s *Sock) outSending() bool {
	return s.sendBuf != nil && unsafe.SliceData(s.sendBuf) == unsafe.SliceData(s.out)
}

// releaseSendBuf ends the in-flight send's hold on its array and returns
// the array to the loop if the queue moved to another one meanwhile.
func (s *Sock) releaseSendBuf() {
	if sb := s.sendBuf; sb != nil && unsafe.SliceData(sb) != unsafe.SliceData(s.out) {
		s.l.putBuf(sb)
	}
	s.sendBuf = nil
}

// wrote records n queued bytes handed to the kernel and reports whether
// the queue became empty.
func (s *Sock) wrote(n int) bool {
	s.off += n
	if s.off < len(s.out) {
		return false
	}
	s.dropOut()
	return true
}

// drained runs after the queue emptied: shutdown, detach, OnDrained.
func (s *Sock) drained() {
	if s.flags&(fShutWr|fShutDone) == fShutWr {
		s.l.drv.shutWrite(s)
	}
	if s.flags&fDetach != 0 {
		s.l.deferSock(s)
		return
	}
	if sp := s.spl; sp != nil && sp.dst == s {
		s.l.deferSock(sp.src) // the pipe's bytes follow the queue's
	}
	if s.flags&fClosed == 0 {
		s.h.OnDrained(s)
	}
}

func (s *Sock) dropOut() {
	if s.out != nil && !s.isSending() {
		s.l.putBuf(s.out)
		s.out, s.off = nil, 0
	}
}

// dropStash gives the stash's buffer back, unless a Detach callback took
// it (Unread) or an OnRead still reads it.
func (s *Sock) dropStash() {
	if s.stash == nil {
		return
	}
	if s.flags&fUnreadTaken != 0 || unsafe.SliceData(s.stash) == unsafe.SliceData(s.l.lent) {
		s.l.nBufs.Add(-1)
	} else {
		s.l.putBuf(s.stash)
	}
	s.stash = nil
}

// consumeStash removes the stash's first n bytes, moving the rest to the
// front (at most recvLimit bytes, a few times per pause).
func (s *Sock) consumeStash(n int) {
	if n >= len(s.stash) {
		s.dropStash()
		return
	}
	k := copy(s.stash, s.stash[n:])
	s.stash = s.stash[:k]
}

// listener is a Listen registration.
type listener struct {
	l     *Loop
	fd    int
	h     AcceptHandler
	idx   int
	gone  bool
	retry Timer // after accept failed (EMFILE...)
}

// Listen accepts connections on the listening socket fd (non-blocking)
// and passes them to h. Several loops may listen on the same fd (each
// accepted connection goes to one of them) or each on its own
// SO_REUSEPORT socket.
func (l *Loop) Listen(fd int, h AcceptHandler) error {
	for _, ln := range l.listeners {
		if ln != nil && ln.fd == fd && !ln.gone {
			return fmt.Errorf("evloop: listen fd %d: already listening", fd)
		}
	}
	if v, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_ACCEPTCONN); err != nil || v == 0 {
		if err == nil {
			err = unix.EINVAL
		}
		return fmt.Errorf("evloop: listen fd %d: not a listening socket: %w", fd, err)
	}
	ln := &listener{l: l, fd: fd, h: h, idx: len(l.listeners)}
	l.listeners = append(l.listeners, ln)
	if err := l.drv.listen(ln); err != nil {
		l.listeners[ln.idx] = nil
		return fmt.Errorf("evloop: listen fd %d: %w", fd, err)
	}
	return nil
}

// Unlisten stops accepting on fd; it does not close fd. Connections the
// kernel queued stay there (for another loop, or the fd's close).
func (l *Loop) Unlisten(fd int) {
	for i, ln := range l.listeners {
		if ln != nil && ln.fd == fd && !ln.gone {
			ln.gone = true
			ln.retry.Stop()
			l.drv.unlisten(ln)
			l.listeners[i] = nil
		}
	}
}

// acceptFailed pauses accepting on ln (EMFILE and the like) and retries
// after 100 ms, so a full fd table does not spin the loop.
func (l *Loop) acceptFailed(ln *listener, err error) {
	l.log.Warn("evloop: accept failed, retrying in 100ms", "fd", ln.fd, "err", err)
	if ln.retry.l == nil {
		ln.retry.Init(l, func() {
			if !ln.gone {
				l.drv.listen(ln)
			}
		})
	}
	ln.retry.Reset(l.clock() + 100*int64(time.Millisecond))
}

// Add takes the connected non-blocking socket fd into the loop; reading
// starts armed. On error fd is not closed.
func (l *Loop) Add(fd int, h Handler) (*Sock, error) {
	s := &Sock{l: l, h: h, fd: fd}
	l.track(s)
	if err := l.drv.add(s); err != nil {
		l.untrack(s)
		return nil, fmt.Errorf("evloop: add fd %d: %w", fd, err)
	}
	return s, nil
}

// Connect starts a non-blocking connect of the socket fd (non-blocking,
// not yet connected) to sa; h.OnConnect reports the result. On error fd
// is not closed. golang.org/x/sys/unix writes into sa while connecting:
// do not share one sa between loops (keep one per loop).
func (l *Loop) Connect(fd int, sa unix.Sockaddr, h Handler) (*Sock, error) {
	err := unix.Connect(fd, sa)
	if err != nil && err != unix.EINPROGRESS {
		return nil, fmt.Errorf("evloop: connect fd %d: %w", fd, err)
	}
	s := &Sock{l: l, h: h, fd: fd}
	if err != nil {
		s.flags |= fConnecting
	}
	l.track(s)
	if err := l.drv.add(s); err != nil {
		l.untrack(s)
		return nil, fmt.Errorf("evloop: connect fd %d: %w", fd, err)
	}
	if s.flags&fConnecting == 0 {
		s.flags |= fConnected
		l.deferSock(s)
	}
	return s, nil
}

// connected ends a pending connect (drivers call it once fd is writable
// or failed); it reports whether s is usable.
func (s *Sock) connected() bool {
	s.flags &^= fConnecting
	errno, err := unix.GetsockoptInt(s.fd, unix.SOL_SOCKET, unix.SO_ERROR)
	if err == nil && errno != 0 {
		err = unix.Errno(errno)
	}
	if s.flags&fClosed != 0 {
		return false
	}
	if err != nil {
		err = fmt.Errorf("evloop: connect: %w", err)
		s.err = err
		s.h.OnConnect(s, err)
		s.Close()
		return false
	}
	s.h.OnConnect(s, nil)
	if s.flags&(fClosed|fShutWr|fShutDone) == fShutWr && s.Pending() == 0 && !s.isSending() {
		s.l.drv.shutWrite(s) // CloseWrite during the connect
	}
	return s.flags&fClosed == 0
}

func (l *Loop) untrack(s *Sock) {
	l.socks[s.slot] = nil
	l.gens[s.slot]++
	l.free = append(l.free, s.slot)
	l.nSocks.Add(-1)
	s.flags |= fClosed
}

// Watch is a readiness registration (Loop.Watch).
type Watch struct {
	l       *Loop
	fd      int
	fn      func()
	idx     int
	gen     uint32 // of slot idx: a late event of a stopped watch misses
	stopped bool
}

// ud is the user data the drivers carry for w's events.
func (w *Watch) ud() uint64 { return udWatch | uint64(w.gen&0xffffff)<<32 | uint64(w.idx) }

// Watch calls onReadable on the loop thread when fd becomes readable. It
// is edge-triggered: onReadable must read until EAGAIN, else it may not
// be called again; it may be called when nothing is there. The caller
// owns fd (Stop before closing it).
func (l *Loop) Watch(fd int, onReadable func()) (*Watch, error) {
	w := &Watch{l: l, fd: fd, fn: onReadable}
	if n := len(l.watchFree); n > 0 { // slots are reused: watches come and go with reloads and rebinds
		w.idx = int(l.watchFree[n-1])
		l.watchFree = l.watchFree[:n-1]
		l.watches[w.idx] = w
	} else {
		w.idx = len(l.watches)
		l.watches = append(l.watches, w)
		l.watchGens = append(l.watchGens, 0)
	}
	w.gen = l.watchGens[w.idx]
	if err := l.drv.watch(w); err != nil {
		l.freeWatch(w)
		return nil, fmt.Errorf("evloop: watch fd %d: %w", fd, err)
	}
	return w, nil
}

// freeWatch gives w's slot back; a later event for w finds another
// generation there.
func (l *Loop) freeWatch(w *Watch) {
	l.watches[w.idx] = nil
	l.watchGens[w.idx]++
	l.watchFree = append(l.watchFree, uint32(w.idx))
}

// watchFor is the live watch an event's user data names, or nil.
func (l *Loop) watchFor(ud uint64) *Watch {
	idx := uint32(ud)
	if int(idx) >= len(l.watches) {
		return nil
	}
	if w := l.watches[idx]; w != nil && w.gen&0xffffff == uint32(ud>>32)&0xffffff {
		return w
	}
	return nil
}

// Stop ends the watch; onReadable is not called after Stop returns.
func (w *Watch) Stop() {
	if w.stopped {
		return
	}
	w.stopped = true
	w.l.drv.unwatch(w)
	w.l.freeWatch(w)
}

// user data: kind in the top byte, generation in bits 32-55, slot/index
// below; what epoll and io_uring carry back for each event.
const (
	udSock   = 1 << 56
	udListen = 2 << 56
	udWatch  = 3 << 56
	udWake   = 4 << 56
	udSend   = 5 << 56
	udCancel = 6 << 56
	udConn   = 7 << 56
	udPollIn = 8 << 56 // io_uring POLL_ADD POLLIN: a splice's source is readable
	udSpan   = 9 << 56 // io_uring TIMEOUT ending a span of kernel waits (low bits: its sequence)
	udKind   = 0xff << 56
)

func (s *Sock) ud(kind uint64) uint64 {
	return kind | uint64(s.gen&0xffffff)<<32 | uint64(s.slot)
}

func closeFD(fd int) {
	if fd >= 0 {
		unix.Close(fd)
	}
}

// isSending reports whether a send of queued bytes is in flight
// (io_uring).
func (s *Sock) isSending() bool { return s.sendBuf != nil }
