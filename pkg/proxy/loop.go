package proxy

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/rl-tproxy/rl-tproxy/pkg/evloop"
	"github.com/rl-tproxy/rl-tproxy/pkg/exchange"
)

// The data path: event loops (Config.EventLoops). Every client
// connection belongs to one loop (pkg/evloop: one OS thread), which runs
// its state machine (loopconn.go) from socket events: no goroutine per
// connection, and no buffer while it is idle (buffers come from the
// loop's free list while bytes are unread or a request is in flight).
// Each loop has its own upstream pools (loopup.go); an idle pooled
// upstream connection stays registered with the loop, so bytes or an EOF
// arriving while it idles discard it without a peek on the request path.
// A blocking Hook runs on a worker goroutine (loopadmit.go) and its
// Decision is posted back to the loop; an upgraded connection and a
// handed-off one leave the loop for a goroutine (loophand.go).
//
// The loop types, by job:
//   - loopGroup: the loops of one Proxy and what they share (attached
//     LoopAttachers, admission workers, detached connections).
//   - loopState: what one loop owns (its connections, free lists,
//     upstream pools, scratch buffer), touched only on its thread.
//   - clientConn: one client connection and its state machine
//     (loopconn.go; the states are the lc* constants).
//   - connBuf: a connection's read buffer, lent from the loop's free
//     list while bytes are unread or a request is in flight.
//   - reqState: one request in flight, from its head to the end of its
//     response (loopadmit.go); idle connections hold none.
//   - upstreamConn: one upstream connection (loopup.go), serving one
//     request at a time, idling in its pool in between.
//   - upstreamPool: a loop's idle connections to one upstream address.
//   - hostAddrs: a loop's addresses of an upstream named by host name
//     (loopresolve.go).
// Config.HoldP lets an idle io_uring loop wait inside the kernel holding
// its P (evloop.Config.HoldP) when nothing the loops wait for runs on a
// goroutine.

// loopReadSize is the receive buffer of the loops: the most one OnRead
// delivers. A connection's buffer keeps at least this much free space
// while it reads, or it pauses reading.
const loopReadSize = 16 << 10

// loopBackend, when not Auto, overrides Config.LoopBackend (tests force
// one).
var loopBackend evloop.Backend

// loopMaxPending bounds the bytes queued on one socket before the side
// that feeds it stops reading (backpressure).
const loopMaxPending = 256 << 10

// loopGroup is the Proxy's set of loops.
type loopGroup struct {
	p     *Proxy
	n     int
	mu    sync.Mutex // start, loops
	g     *evloop.Group
	loops []*loopState // by Loop.ID

	attached []*attachment // Attach (attach.go); lg.mu
	// nAttached is len(attached) for Stats, which must not take lg.mu
	// (start holds it while attachers run, and they may read Stats).
	nAttached atomic.Int64
	started   atomic.Pointer[evloop.Group] // g for Stats, once started

	conns atomic.Int64 // open client connections (loop-owned or handed off)
	// offLoop counts connections served by a goroutine of their own
	// (handoffs, Upgrade tunnels): while any runs, loops park (holdP).
	offLoop atomic.Int64
	upIdle  atomic.Int64 // idle pooled upstream connections
	upPools atomic.Int64 // the loops' upstream pools (loopState.pools)
	// inFlight counts each loop's requests in progress (by Loop.ID; a
	// head begun until its response is done): written by that loop only,
	// read by its holdP and by Stats.
	inFlight []atomic.Int32
	workers  admitWorkers
	detached detachedConns

	shutMu  sync.Mutex // one Shutdown at a time
	stopped bool       // the loops are stopped (a later Shutdown has nothing to do)

	testAfterForce func() // tests: called after Shutdown's deadline closed every connection
}

func newLoopGroup(p *Proxy, n int) *loopGroup {
	lg := &loopGroup{p: p, n: n, inFlight: make([]atomic.Int32, n)}
	lg.workers.idleTimeout = admitWorkerIdle
	return lg
}

// start starts the loops once; p.mu is held.
func (lg *loopGroup) start() error {
	lg.mu.Lock()
	defer lg.mu.Unlock()
	if lg.g != nil {
		return nil
	}
	be := lg.p.cfg.Load().LoopBackend
	if loopBackend != evloop.Auto {
		be = loopBackend
	}
	g, err := evloop.Start(evloop.Config{Loops: lg.n, Backend: be, BufSize: loopReadSize, Logger: lg.p.cfg.Load().Logger,
		HoldP: lg.holdP})
	if err != nil {
		return fmt.Errorf("proxy: start event loops: %w", err)
	}
	ls := g.Loops()
	loops := make([]*loopState, len(ls))
	for _, l := range ls {
		loops[l.ID()] = newLoopState(lg, l)
	}
	if err := lg.attachStarted(loops); err != nil {
		g.Close()
		return fmt.Errorf("proxy: start event loops: %w", err)
	}
	lg.loops = loops
	lg.g = g
	lg.started.Store(g)
	lg.p.cfg.Load().Log().Info("event loops started", "loops", len(ls), "backend", g.Backend().String())
	return nil
}

// each runs fn on every loop's thread and waits for all of them.
func (lg *loopGroup) each(fn func(ls *loopState)) {
	lg.mu.Lock()
	loops := lg.loops
	lg.mu.Unlock()
	var wg sync.WaitGroup
	for _, ls := range loops {
		wg.Add(1)
		ls.l.Post(func() { fn(ls); wg.Done() })
	}
	wg.Wait()
}

// loopListener is one listener shared by every loop (a dup of the
// net.Listener's descriptor).
type loopListener struct {
	lg   *loopGroup
	fd   int
	pick func(*Config, netip.AddrPort) *exchange.Service
}

// serve is Serve on the loop path: the loops accept on a duplicate of
// ln's descriptor; this goroutine only waits for ln to be closed (by
// Shutdown or the caller), then stops the loops accepting on it.
func (lg *loopGroup) serve(ln net.Listener, pick func(*Config, netip.AddrPort) *exchange.Service) error {
	return lg.serveOn(ln, pick, -1)
}

// serveOn is serve with only the loop whose ID is only accepting on ln's
// descriptor (every loop when only < 0): a listener group gives each loop
// a socket of its own (group.go).
func (lg *loopGroup) serveOn(ln net.Listener, pick func(*Config, netip.AddrPort) *exchange.Service, only int) error {
	p := lg.p
	p.mu.Lock()
	if p.shutdown.Load() {
		p.mu.Unlock()
		ln.Close()
		return ErrClosed
	}
	if err := lg.start(); err != nil {
		p.mu.Unlock()
		return err
	}
	p.listeners[ln] = struct{}{}
	p.wg.Add(1)
	p.mu.Unlock()
	defer p.wg.Done()
	defer func() {
		p.mu.Lock()
		delete(p.listeners, ln)
		p.mu.Unlock()
	}()
	fd, err := dupListener(ln)
	if err != nil {
		if p.shutdown.Load() { // Shutdown closed ln before it was taken
			return ErrClosed
		}
		return err
	}
	lst := &loopListener{lg: lg, fd: fd, pick: pick}
	var lerr error
	if fd >= 0 {
		var lmu sync.Mutex
		lg.each(func(ls *loopState) {
			if only >= 0 && ls.l.ID() != only {
				return
			}
			if err := ls.l.Listen(fd, lst); err != nil {
				lmu.Lock()
				lerr = err
				lmu.Unlock()
			}
		})
	}
	switch {
	case lerr != nil:
	case fd >= 0:
		err = waitClosed(ln)
	default:
		err = lst.acceptGo(ln)
	}
	if fd >= 0 {
		lg.each(func(ls *loopState) {
			if only < 0 || ls.l.ID() == only {
				ls.l.Unlisten(fd)
			}
		})
		unix.Close(fd)
	}
	switch {
	case p.shutdown.Load():
		return ErrClosed
	case lerr != nil:
		return fmt.Errorf("listen on %s: %w", ln.Addr(), lerr)
	}
	return fmt.Errorf("accept on %s: %w", ln.Addr(), err)
}

// dupListener returns a duplicate of ln's descriptor for the loops, or -1
// when ln has none (a wrapper): then every connection comes through
// ln.Accept (acceptGo).
func dupListener(ln net.Listener) (int, error) {
	sc, ok := ln.(syscall.Conn)
	if !ok {
		return -1, nil
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return -1, fmt.Errorf("listener %s: %w", ln.Addr(), err)
	}
	fd := -1
	var derr error
	if err := raw.Control(func(f uintptr) { fd, derr = unix.FcntlInt(f, unix.F_DUPFD_CLOEXEC, 0) }); err != nil {
		return -1, fmt.Errorf("listener %s: %w", ln.Addr(), err)
	}
	if derr != nil {
		return -1, fmt.Errorf("dup listener %s: %w", ln.Addr(), derr)
	}
	return fd, nil
}

// closedPoll is how often waitClosed looks whether a listener that does
// not announce its close (one not from Listen or ListenGroup) closed; a
// variable for the tests only.
var closedPoll = 50 * time.Millisecond

// waitClosed returns once ln is closed (by Shutdown or the caller), which
// is how Serve learns that it must stop, without accepting: the loops
// accept on their duplicate of the socket. A goroutine accepting beside
// them won every connection it was woken for first once the process had
// a P the loops did not hold (GOMAXPROCS above the loops),
// each one a net.Conn, a dup, a close and a hand-off to a loop. A listener
// from Listen or ListenGroup announces its Close (closeAnnouncer), so
// Serve returns at once and a reload that drops an address does not wait.
// For any other listener (a listener's RawConn cannot wait for
// readability: Read is EINVAL, and a wait on a duplicate would not end
// with ln's Close) it looks every closedPoll, so Serve returns at most
// that much after the close.
func waitClosed(ln net.Listener) error {
	sc, ok := ln.(syscall.Conn)
	if !ok {
		return fmt.Errorf("listener %T has no descriptor", ln)
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return err
	}
	if ca, ok := ln.(closeAnnouncer); ok {
		<-ca.closed()
		if err := raw.Control(func(uintptr) {}); err != nil {
			return err
		}
		return net.ErrClosed
	}
	t := time.NewTicker(closedPoll)
	defer t.Stop()
	for range t.C {
		if err := raw.Control(func(uintptr) {}); err != nil {
			return err
		}
	}
	return nil
}

// acceptGo accepts on ln itself until ln is closed (by Shutdown or the
// caller), for a listener with no descriptor to share with the loops (a
// wrapper): every connection is posted to a loop in turn. Transient
// errors (EMFILE and friends) back off.
func (a *loopListener) acceptGo(ln net.Listener) error {
	var backoff time.Duration
	next := 0
	for {
		nc, err := ln.Accept()
		if err != nil {
			if a.lg.p.shutdown.Load() {
				return err
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() || transientAcceptErr(err) {
				backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
				a.lg.p.cfg.Load().Log().Warn("accept", "err", err, "retry_in", backoff)
				time.Sleep(backoff)
				continue
			}
			return err
		}
		backoff = 0
		fd, err := dupConnFD(nc)
		nc.Close()
		if err != nil {
			continue
		}
		l := a.lg.loops[next%len(a.lg.loops)].l
		next++
		l.Post(func() { a.OnAccept(l, fd, netip.AddrPort{}) })
	}
}

// OnAccept takes a new client connection onto the accepting loop.
func (a *loopListener) OnAccept(l *evloop.Loop, fd int, remote netip.AddrPort) {
	lg := a.lg
	if lg.p.shutdown.Load() {
		unix.Close(fd)
		return
	}
	ls := lg.loops[l.ID()]
	c := ls.getConn()
	c.pick = a.pick
	if !remote.IsValid() {
		remote = evloop.PeerAddr(fd)
	}
	c.remote = remote
	c.local = evloop.LocalAddr(fd)
	unix.SetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_NODELAY, 1)
	s, err := l.Add(fd, c)
	if err != nil {
		unix.Close(fd)
		ls.putConn(c)
		return
	}
	lg.conns.Add(1)
	ls.link(c)
	c.s = s
	c.opened()
}

// shutdown is Shutdown on the loop path (listeners are closed already).
func (lg *loopGroup) shutdown(ctx context.Context) error {
	lg.shutMu.Lock()
	defer lg.shutMu.Unlock()
	lg.mu.Lock()
	started := lg.g != nil
	lg.mu.Unlock()
	if !started || lg.stopped {
		lg.workers.close()
		lg.p.wg.Wait()
		return nil
	}
	defer func() { lg.stopped = true }()
	lg.each(func(ls *loopState) { ls.drain() })
	poll := time.Millisecond
	timer := time.NewTimer(poll)
	defer timer.Stop()
	var err error
wait:
	for !lg.idle() {
		select {
		case <-ctx.Done():
			err = ctx.Err()
			lg.detached.closeAll()
			lg.each(func(ls *loopState) { ls.closeAll() })
			if lg.testAfterForce != nil {
				lg.testAfterForce()
			}
			lg.waitForced()
			break wait
		case <-timer.C:
			poll = min(2*poll, 50*time.Millisecond)
			timer.Reset(poll)
		}
	}
	lg.p.wg.Wait() // Serve goroutines
	lg.each(func(ls *loopState) { ls.closePools() })
	lg.detachAll()
	lg.workers.close()
	lg.mu.Lock()
	g := lg.g
	lg.mu.Unlock()
	if cerr := g.Close(); cerr != nil && err == nil {
		err = fmt.Errorf("proxy: stop event loops: %w", cerr)
	}
	return err
}

// forcedWait bounds how long Shutdown waits, after its deadline closed
// every connection, for what still holds one: goroutines of detached
// connections ending, and pending admissions, which keep their
// connection until the Hook answers.
const forcedWait = time.Second

// waitForced waits for the loops to become idle after a forced close, at
// most forcedWait: a Hook that never answers must not hold Shutdown for
// ever (its late Resume is dropped by the stopped loop).
func (lg *loopGroup) waitForced() {
	until := time.Now().Add(forcedWait)
	for !lg.idle() {
		if time.Now().After(until) {
			lg.p.cfg.Load().Log().Warn("shutdown: admissions still pending after the deadline; stopping without their decisions",
				"connections", lg.conns.Load(), "admission_jobs", lg.workers.busy.Load())
			return
		}
		time.Sleep(time.Millisecond)
	}
}

// holdP is the loops' evloop.Config.HoldP: idle loop l may wait in the
// kernel holding its P while no goroutine of the data path needs one (no
// connection served by a goroutine, no blocking Hook call or upstream
// dial on a worker), l has at most Config.HoldPInFlight requests in
// progress (when set) and Config.HoldP says the Hook's work is all on the
// loops. Called on l's goroutine before every wait.
func (lg *loopGroup) holdP(l *evloop.Loop) bool {
	cfg := lg.p.cfg.Load()
	if cfg.HoldP == nil || lg.offLoop.Load() != 0 || lg.workers.busy.Load() != 0 {
		return false
	}
	if cfg.HoldPInFlight > 0 && int(lg.inFlight[l.ID()].Load()) > cfg.HoldPInFlight {
		return false
	}
	return cfg.HoldP()
}

// idle reports whether no client connection and no admission worker job
// is left.
func (lg *loopGroup) idle() bool { return lg.conns.Load() == 0 && lg.workers.busy.Load() == 0 }

func (lg *loopGroup) stats() Stats {
	st := Stats{Conns: int(lg.conns.Load()), UpstreamIdle: int(lg.upIdle.Load()), UpstreamPools: int(lg.upPools.Load()),
		UpstreamDiscarded: lg.p.discarded.Load(), Attached: int(lg.nAttached.Load()),
		UpstreamLookups: lg.p.lookups.Load(), UpstreamLookupErrors: lg.p.lookupErrs.Load()}
	if g := lg.started.Load(); g != nil {
		st.Loops = g.Stats()
	}
	for i := range lg.inFlight {
		st.Requests += int(lg.inFlight[i].Load())
	}
	return st
}

// detachedConns are client connections served by a goroutine after they
// left their loop (handoff, upgrade tunnel); Shutdown's deadline closes
// them, and any added after it (a detach that completed late).
type detachedConns struct {
	mu     sync.Mutex
	m      map[net.Conn]struct{}
	closed bool
}

func (d *detachedConns) add(nc net.Conn) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		nc.Close() // its goroutine finds it closed and ends
		return
	}
	if d.m == nil {
		d.m = map[net.Conn]struct{}{}
	}
	d.m[nc] = struct{}{}
}

func (d *detachedConns) remove(nc net.Conn) {
	d.mu.Lock()
	delete(d.m, nc)
	d.mu.Unlock()
}

func (d *detachedConns) closeAll() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.closed = true
	for nc := range d.m {
		nc.Close()
	}
}

// errLoopTimeout is a timeout on the loop path; isTimeout reports it.
var errLoopTimeout = fmt.Errorf("i/o timeout: %w", errDeadline)

var errDeadline error = deadlineErr{}

type deadlineErr struct{}

func (deadlineErr) Error() string   { return "deadline exceeded" }
func (deadlineErr) Timeout() bool   { return true }
func (deadlineErr) Temporary() bool { return true }

var _ net.Error = deadlineErr{}
