package evloop

import (
	"errors"
	"fmt"
	"os"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// parker makes a loop wait for its next turn in Go's netpoller instead of
// a blocking epoll_wait/io_uring_enter: the loop goroutine parks on a
// pollable fd that turns readable when the loop has work (the epoll set
// itself; for io_uring an eventfd registered with the ring), so its P is
// free at once for the goroutines whose answers the loop waits for (a
// RateLimitly client's receiver, a blocking Hook's worker). A blocking
// wait holds the P as an announced system call, and with GOMAXPROCS=1
// those goroutines then run only after the runtime's monitor retakes it
// (20 µs to 10 ms later).
type parker struct {
	l     *Loop
	f     *os.File
	rc    syscall.RawConn
	check func(uintptr) bool // p.poll, made once (no allocation per turn)
	got   bool
	err   error
	slept bool  // the wait's first check found nothing: the goroutine parked
	first bool  // the next check is the wait's first
	dl    int64 // deadline set on f, in the loop's clock; 0: none
	// before runs ahead of the first non-blocking check of a wait, after
	// when the wait ends (io_uring: enable and disable the eventfd).
	before, after func()
}

// newParker takes fd (it is closed with the parker) and registers it with
// Go's netpoller.
func newParker(l *Loop, fd int) (*parker, error) {
	if err := unix.SetNonblock(fd, true); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("set nonblock: %w", err)
	}
	f := os.NewFile(uintptr(fd), "evloop")
	// A deadline can be set only on an fd the netpoller took.
	if err := f.SetReadDeadline(time.Time{}); err != nil {
		f.Close()
		return nil, fmt.Errorf("netpoller refused the loop's fd: %w", err)
	}
	rc, err := f.SyscallConn()
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("syscall conn: %w", err)
	}
	p := &parker{l: l, f: f, rc: rc}
	p.check = p.poll
	return p, nil
}

// poll is the netpoller's readiness check: a non-blocking turn of the
// driver; true when it found something (or failed), or when a function
// was posted or the group closes (a Post wakes the parked loop through
// its fd without a completion on io_uring).
func (p *parker) poll(uintptr) bool {
	p.got, p.err = p.l.drv.poll(0)
	ready := p.got || p.err != nil || p.l.stop.Load() || p.l.hasPosted()
	if p.first {
		p.first, p.slept = false, !ready
	}
	return ready
}

// wait runs the driver once without blocking and, when that found
// nothing, parks until the loop's fd is readable or the next timer is due,
// then runs the driver again.
func (p *parker) wait() error {
	var dl int64
	if len(p.l.timers) > 0 {
		dl = max(p.l.timers[0].at, 1)
	}
	if dl != p.dl {
		t := time.Time{}
		if dl != 0 {
			t = p.l.base.Add(time.Duration(dl))
		}
		if err := p.f.SetReadDeadline(t); err != nil {
			return fmt.Errorf("set deadline: %w", err)
		}
		p.dl = dl
	}
	if p.before != nil {
		p.before()
	}
	p.got, p.err, p.first, p.slept = false, nil, true, false
	err := p.rc.Read(p.check)
	if p.after != nil {
		p.after()
	}
	if p.slept {
		p.l.nParks.Add(1)
	}
	switch {
	case err == nil:
		return p.err
	case errors.Is(err, os.ErrDeadlineExceeded):
		_, err = p.l.drv.poll(0) // the timer is due: read the clock, take what came
		return err
	}
	return fmt.Errorf("netpoll wait: %w", err)
}

func (p *parker) close() { p.f.Close() }
