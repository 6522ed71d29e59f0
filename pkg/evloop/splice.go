package evloop

import (
	"errors"
	"fmt"
	"io"
	"unsafe"

	"golang.org/x/sys/unix"
)

// SpliceHandler is implemented by the Handler of a socket that is the
// source of a splice (Sock.SpliceTo).
type SpliceHandler interface {
	// OnSpliced reports the end of the splice from s: moved bytes went to
	// the destination. err is nil when all the bytes asked for moved,
	// io.EOF when s's peer ended first, ErrSpliceDst when the destination
	// closed or failed first, or s's read error. s reads again (OnRead,
	// OnEOF) after OnSpliced returns unless it paused, closed or spliced
	// again.
	OnSpliced(s *Sock, moved int64, err error)
}

// ErrSpliceDst ends a splice whose destination closed or failed.
var ErrSpliceDst = errors.New("evloop: splice destination closed")

// SplicePipeSize is the capacity asked for each splice's pipe: what the
// kernel holds in flight between the two sockets of one splice.
const SplicePipeSize = 256 << 10

// spliceTurn bounds the bytes one splice moves before the rest of the
// turn runs (then it goes on later in the turn or the next one).
const spliceTurn = 1 << 20

// pipesKept bounds the idle pipes a loop keeps for later splices.
const pipesKept = 16

// splice is one Sock.SpliceTo in progress: src's next left bytes go
// through a pipe into dst, inside the kernel.
type splice struct {
	src, dst *Sock
	pipe     [2]int // read end, write end
	cap      int    // the pipe's capacity
	inPipe   int    // bytes in the pipe, not yet in dst
	left     int64  // bytes still to take from src
	moved    int64  // bytes handed to dst (its queue or its socket)
	srcEOF   bool   // splice from src returned 0
	ended    bool   // dst went away: finish with err at the next pump
	err      error
	waitIn   bool // io_uring: a POLLIN on src is in flight
	waitOut  bool // dst was full: waiting for it to take more
}

// SpliceTo moves the next n bytes s receives to dst without copying them
// through user space (splice(2) through a pipe), after the bytes dst has
// queued. Until the splice ends, s gets no OnRead or OnEOF and dst must
// not be written (dst still reads as usual); then s's handler, which
// must be a SpliceHandler, gets OnSpliced. A socket takes part in one
// splice at a time. Bytes the loop had received for s and not delivered
// (io_uring's stash) go first, through dst's queue.
func (s *Sock) SpliceTo(dst *Sock, n int64) error {
	switch {
	case n <= 0:
		return fmt.Errorf("evloop: splice of %d bytes", n)
	case dst == s || dst.l != s.l:
		return errors.New("evloop: splice to itself or to another loop's socket")
	case s.flags&(fClosed|fEOF) != 0 || s.err != nil,
		dst.flags&(fClosed|fShutWr|fConnecting) != 0 || dst.err != nil:
		return ErrClosed
	case s.spl != nil || dst.spl != nil:
		return errors.New("evloop: socket already in a splice")
	}
	if _, ok := s.h.(SpliceHandler); !ok {
		return errors.New("evloop: splice source's handler is not a SpliceHandler")
	}
	l := s.l
	sp, err := l.getSplice()
	if err != nil {
		return err
	}
	sp.src, sp.dst, sp.left = s, dst, n
	s.spl, dst.spl = sp, sp
	s.flags |= fSplice
	if l.ur != nil && s.flags&(fArmed|fRecvCancel) == fArmed {
		// The recv must end before the pipe takes bytes: what it takes
		// meanwhile is stashed, and goes first.
		s.flags |= fRecvCancel
		l.ur.cancel(s.ud(udSock), -1)
		l.ur.r.submit()
	}
	l.deferSock(s)
	return nil
}

// Splicing reports whether s is the source or destination of a splice.
func (s *Sock) Splicing() bool { return s.spl != nil }

// SpliceMoved returns the bytes s's current splice moved so far (0 when
// none runs): progress for a caller's idle timer.
func (s *Sock) SpliceMoved() int64 {
	if s.spl == nil {
		return 0
	}
	return s.spl.moved
}

// Buffered reports whether bytes from s's peer wait unread: received by
// the loop and not delivered, or in the kernel's receive queue.
func (s *Sock) Buffered() bool {
	if len(s.stash) > 0 {
		return true
	}
	if s.fd < 0 {
		return false
	}
	var b [1]byte
	n, _, e := unix.RawSyscall6(unix.SYS_RECVFROM, uintptr(s.fd), uintptr(unsafe.Pointer(&b[0])), 1,
		unix.MSG_PEEK|unix.MSG_DONTWAIT, 0, 0)
	return e == 0 && n > 0
}

// pump moves what it can, both ways at once: the pipe empties into dst
// while dst takes bytes and fills from src while src has bytes and the
// pipe room, so a slow side does not stop the other until the pipe is
// full or empty. It runs on events for either socket and from runLater.
func (sp *splice) pump() {
	src := sp.src
	if sp.ended {
		sp.finish(sp.err)
		return
	}
	if src.flags&fArmed != 0 {
		return // io_uring: the recv's cancel has not completed (recvDone defers s)
	}
	if len(src.stash) > 0 && sp.left > 0 {
		sp.fromStash()
	}
	for budget := spliceTurn; ; {
		out := sp.drain()
		if out < 0 {
			return // dst failed: sp is over
		}
		in := sp.fill()
		if in < 0 {
			return // src failed: finished
		}
		if sp.inPipe == 0 && (sp.left == 0 || sp.srcEOF) {
			if sp.left == 0 {
				sp.finish(nil)
			} else {
				sp.finish(io.EOF)
			}
			return
		}
		if in == 0 && out == 0 {
			return // each side waits for its event (drain, fill)
		}
		budget -= out
		if budget <= 0 {
			src.l.deferSock(src)
			return
		}
	}
}

// drain moves the pipe's bytes into dst, after dst's queue; it returns
// the bytes moved, or -1 when dst failed (and sp ended).
func (sp *splice) drain() int {
	dst := sp.dst
	if sp.inPipe == 0 || sp.waitOut || dst.Pending() > 0 || dst.isSending() {
		return 0 // nothing to move, or an event comes: POLLOUT/EPOLLOUT, drained()
	}
	for {
		k, err := rawSplice(sp.pipe[0], dst.fd, sp.inPipe, sp.left > 0)
		switch err {
		case nil:
			sp.inPipe -= k
			sp.moved += int64(k)
			sp.src.l.nSpliced.Add(uint64(k))
			return k
		case unix.EINTR:
			continue
		case unix.EAGAIN:
			sp.waitOut = true
			sp.src.l.drv.spliceWait(dst, false)
			return 0
		default:
			dst.failNow(fmt.Errorf("evloop: splice: %w", err)) // ends sp (Close)
			return -1
		}
	}
}

// fill moves bytes from src into the pipe; it returns the bytes moved
// (0: src is empty or at its end, or the pipe full), or -1 when src
// failed (and sp finished).
func (sp *splice) fill() int {
	src := sp.src
	want := int(min(sp.left, int64(sp.cap-sp.inPipe)))
	if want <= 0 || sp.srcEOF {
		return 0
	}
	for {
		k, err := rawSplice(src.fd, sp.pipe[1], want, false)
		switch {
		case err == unix.EINTR:
			continue
		case err == unix.EAGAIN:
			// With bytes in the pipe this may be the pipe out of slots
			// rather than src empty: then dst's progress comes back here.
			if sp.inPipe == 0 && !sp.waitIn {
				sp.waitIn = src.l.ur != nil // epoll: the next edge comes anyway
				src.l.drv.spliceWait(src, true)
			}
			return 0
		case err != nil:
			sp.finish(fmt.Errorf("evloop: splice: %w", err))
			return -1
		case k == 0:
			sp.srcEOF = true
			src.flags |= fRdHup
			return 0
		}
		sp.inPipe += k
		sp.left -= int64(k)
		return k
	}
}

// fromStash hands what the loop received for src before the splice took
// over to dst's queue, up to the bytes asked for.
func (sp *splice) fromStash() {
	src := sp.src
	b := src.stash
	k := int(min(int64(len(b)), sp.left))
	sp.dst.Write(b[:k])
	src.consumeStash(k)
	sp.left -= int64(k)
	sp.moved += int64(k)
}

// finish ends the splice, reports it to src's handler and lets src read
// again.
func (sp *splice) finish(err error) {
	src, dst := sp.src, sp.dst
	moved := sp.moved
	src.spl = nil
	src.flags &^= fSplice
	if dst != nil {
		dst.spl = nil
	}
	l := src.l
	l.putSplice(sp)
	if src.flags&fClosed != 0 {
		return
	}
	src.h.(SpliceHandler).OnSpliced(src, moved, err)
	if src.flags&(fClosed|fPaused|fSplice) == 0 {
		src.flags |= fReadable // bytes past the splice raised no new edge
		l.drv.resumeRead(src)
	}
}

// detach takes s out of its splice when it closes: the pipe's bytes are
// dropped; a source still open learns it from OnSpliced.
func (sp *splice) detach(s *Sock) {
	s.spl = nil
	if s == sp.dst {
		sp.dst = nil
		if sp.src.flags&fClosed == 0 && !sp.ended {
			sp.ended, sp.err = true, ErrSpliceDst
			sp.src.l.deferSock(sp.src)
		}
		return
	}
	s.flags &^= fSplice
	if sp.dst != nil {
		sp.dst.spl = nil
	}
	s.l.putSplice(sp)
}

// spliceReady runs on a readiness event for s that a splice waits for.
func (sp *splice) ready(s *Sock, in bool) {
	if in && s == sp.src {
		sp.waitIn = false
		sp.pump()
	} else if !in && s == sp.dst && sp.waitOut {
		sp.waitOut = false
		sp.pump()
	}
}

func (l *Loop) getSplice() (*splice, error) {
	var sp *splice
	if n := len(l.splices); n > 0 {
		sp = l.splices[n-1]
		l.splices[n-1] = nil
		l.splices = l.splices[:n-1]
	} else {
		sp = &splice{pipe: [2]int{-1, -1}}
	}
	if sp.pipe[0] < 0 {
		if err := unix.Pipe2(sp.pipe[:], unix.O_NONBLOCK|unix.O_CLOEXEC); err != nil {
			l.splices = append(l.splices, sp)
			return nil, fmt.Errorf("evloop: splice pipe: %w", err)
		}
		// Best effort: past the user's pipe quota the kernel keeps its
		// default (64 KiB, or less).
		sp.cap = 64 << 10
		if n, err := unix.FcntlInt(uintptr(sp.pipe[1]), unix.F_SETPIPE_SZ, SplicePipeSize); err == nil {
			sp.cap = n
		} else if n, err := unix.FcntlInt(uintptr(sp.pipe[1]), unix.F_GETPIPE_SZ, 0); err == nil {
			sp.cap = n
		}
		l.nPipes.Add(1)
	}
	return sp, nil
}

// putSplice keeps sp (and its pipe, when empty) for a later splice.
func (l *Loop) putSplice(sp *splice) {
	if sp.inPipe > 0 || len(l.splices) >= pipesKept {
		sp.closePipe(l)
	}
	*sp = splice{pipe: sp.pipe, cap: sp.cap}
	if len(l.splices) < pipesKept {
		l.splices = append(l.splices, sp)
	}
}

func (sp *splice) closePipe(l *Loop) {
	if sp.pipe[0] >= 0 {
		unix.Close(sp.pipe[0])
		unix.Close(sp.pipe[1])
		sp.pipe = [2]int{-1, -1}
		l.nPipes.Add(-1)
	}
}

// closePipes closes the idle pipes (shutdown).
func (l *Loop) closePipes() {
	for _, sp := range l.splices {
		sp.closePipe(l)
	}
	l.splices = nil
}

// rawSplice moves up to n bytes from in to out without blocking.
func rawSplice(in, out, n int, more bool) (int, error) {
	flags := unix.SPLICE_F_NONBLOCK | unix.SPLICE_F_MOVE
	if more {
		flags |= unix.SPLICE_F_MORE
	}
	r, _, e := unix.RawSyscall6(unix.SYS_SPLICE, uintptr(in), 0, uintptr(out), 0, uintptr(n), uintptr(flags))
	if e != 0 {
		return 0, e
	}
	return int(r), nil
}
