package evloop

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// parker makes a loop wait for its next turn in Go's netpoller instead of
// a blocking epoll_wait/io_uring_enter: the loop goroutine parks on a
// pollable fd that turns readable when the loop has work (epoll: the park
// set; io_uring: an eventfd registered with the ring), so its P is
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
	// when the wait ends (io_uring: enable and disable the eventfd;
	// epoll: arm and disarm the park set).
	before func() error
	after  func()
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
		if err := p.before(); err != nil {
			return err
		}
	}
	if loopsInKernel.Load() > 0 {
		p.l.g.kickNetpoll() // an M must poll the network for this park (kicker.go)
	}
	p.got, p.err, p.first, p.slept = false, nil, true, false
	loopsParked.Add(1)
	err := p.rc.Read(p.check)
	loopsParked.Add(-1)
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

// loopsAlive counts the running loops of every group in the process.
var loopsAlive atomic.Int32

// spareP says whether the process has a P that no loop holds (GOMAXPROCS
// may change at run time: read at each park, not per wait). Without one,
// a loop waiting in the kernel with its P would leave goroutines woken
// by the netpoller (HTTP/2 connections, an admission client's receiver,
// the admin listener) without a P until it parks: then loops park unless
// Config.HoldP says no goroutine needs a P.
func spareP() bool { return runtime.GOMAXPROCS(0) > int(loopsAlive.Load()) }

// mayHoldP says whether the loop may wait in the kernel holding its P:
// a spare P exists, or the group's Config.HoldP says no goroutine needs
// one.
func (l *Loop) mayHoldP() bool {
	return spareP() || (l.g.holdP != nil && l.g.holdP(l))
}

// kernelSpan is how long after a park a loop with nothing to do waits
// inside epoll_wait/io_uring_enter instead of parking again: with traffic
// (one request at a time is the worst case) every wait is short, and a
// kernel wait costs one system call and one sleep, where a park costs the
// netpoller's epoll_wait and two thread hand-offs of the locked loop
// goroutine (17 against 5 syscalls, 7 against 2-3 context switches per
// request at wrk -c1, docs/bench/evloop.md). The loop holds its P while it
// waits there, announced to nobody (a raw system call: an announced one
// has the runtime's monitor hand the P to a new thread after 20 µs). An
// idle loop parks after kernelSpan, so that the runtime does not preempt
// it every 10 ms; so goroutines that need a P meanwhile wait at most
// kernelSpan plus a turn. Loops wait in the kernel only while the process
// has a P to spare for goroutines (spareP: fewer loops than GOMAXPROCS)
// or Config.HoldP says no goroutine needs one (rl-tproxy: no connection
// served by a goroutine, no blocking Hook at work), checked before every
// wait. Neither backend's parker fd wakes the netpoller during a kernel
// wait (epoll: the park set has no interest in the loop's set; io_uring:
// the eventfd is disabled).
var kernelSpan = int64(time.Millisecond) // a variable for the tests only
