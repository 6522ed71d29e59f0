package evloop

import (
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// Backend is the kernel interface a loop uses.
type Backend uint8

// Backends; Auto picks IOUring and falls back to Epoll.
const (
	Auto Backend = iota
	IOUring
	Epoll
)

func (b Backend) String() string {
	switch b {
	case Auto:
		return "auto"
	case IOUring:
		return "io_uring"
	case Epoll:
		return "epoll"
	}
	return fmt.Sprintf("Backend(%d)", uint8(b))
}

// ParseBackend reads a backend's name as String writes it ("auto",
// "io_uring", "epoll"; "uring" is taken for "io_uring").
func ParseBackend(s string) (Backend, error) {
	switch s {
	case "auto":
		return Auto, nil
	case "io_uring", "uring":
		return IOUring, nil
	case "epoll":
		return Epoll, nil
	}
	return Auto, fmt.Errorf("loop backend %q: want auto, io_uring or epoll", s)
}

// Config configures Start.
type Config struct {
	Loops   int          // default runtime.GOMAXPROCS(0)
	Backend Backend      // default Auto
	BufSize int          // receive buffer size (default 16 KiB)
	Logger  *slog.Logger // default slog.Default()
	// Pin binds loop i's thread to the i-th CPU the process may run on
	// (modulo their number), so a loop stays on one CPU.
	Pin bool
	// BlockingWait makes a loop wait for its next turn inside
	// epoll_wait/io_uring_enter, holding its P (the behaviour before
	// parking in the netpoller; for measurements). By default an idle
	// loop parks in Go's netpoller, so other goroutines run at once.
	BlockingWait bool
	// HoldP, when set, lets an idle loop wait inside the system
	// call holding its P (for up to kernelSpan after each park) while it
	// returns true, also when no P is spare (see kernelSpan). It is called
	// before every wait, so it must be cheap, and it must return false
	// whenever a goroutine other than the loops may need a P soon: one a
	// loop hands work to (a connection served by a goroutine, a blocking
	// call's worker) or one whose answer a loop waits for. Goroutines that
	// need a P while it returns true (timers, an admin request, the
	// garbage collector's workers) wait until the loop parks, at most
	// kernelSpan plus one turn later. It is called on l's own goroutine,
	// so it may read state only l's turns write (what l has in flight).
	HoldP func(l *Loop) bool
}

// DefaultBufSize is Config.BufSize's default.
const DefaultBufSize = 16 << 10

// ErrClosed is returned for operations on a stopped loop or closed socket.
var ErrClosed = errors.New("evloop: closed")

// Stats are a group's counters, summed over its loops.
type Stats struct {
	Loops   int
	Sockets int // sockets in the loops' tables (Add, Connect, accepted and added)
	// Buffers counts receive and write buffers held by sockets (not the
	// loops' own scratch or provided-buffer rings): 0 when every socket
	// is idle.
	Buffers int
	Turns   uint64
	// Parks counts waits in Go's netpoller that slept (the first
	// non-blocking check found nothing), KernelWaits waits entered in the
	// system call with the loop's P held (see Loop.loop).
	Parks, KernelWaits uint64
	// Starved counts io_uring receives that found the provided-buffer
	// ring empty (ENOBUFS) and waited for buffers to return.
	Starved uint64
	// Spliced counts bytes Sock.SpliceTo moved through pipes; Pipes is
	// the pipes open (in splices, or kept for later ones).
	Spliced uint64
	Pipes   int
}

// Group is a set of loops started together.
type Group struct {
	loops   []*Loop
	backend Backend
	holdP   func(*Loop) bool // Config.HoldP
	// kick wakes the group's netpoll kicker (kicker.go); done ends it.
	kick, done chan struct{}
	nKicks     atomic.Uint64 // kickNetpoll calls (tests)
	wg         sync.WaitGroup
	once       sync.Once
	errMu      sync.Mutex
	err        error
}

// driver is a backend: it owns the kernel side of one loop.
type driver interface {
	// poll submits what the turn queued, waits up to timeout ns (< 0:
	// no bound, 0: no wait) and dispatches what came to the loop; it
	// reports whether anything came.
	poll(timeout int64) (bool, error)
	// parkFD returns a new fd (the parker owns it) that is readable when
	// the loop has work, and hooks to run around a parked wait.
	parkFD() (fd int, before func() error, after func(), err error)
	wake() // any goroutine
	listen(ln *listener) error
	unlisten(ln *listener)
	add(s *Sock) error   // reading armed; connecting: wait for writable
	resumeRead(s *Sock)  // from ResumeRead: deliver waiting data later in the turn
	readPending(s *Sock) // from runLater: deliver waiting data now
	pauseRead(s *Sock)
	spliceWait(s *Sock, in bool) // a splice waits for s to be readable (in) or writable
	shutWrite(s *Sock)           // after the queue is empty
	release(s *Sock)             // close or detach: calls l.finish(s) when no op is in flight
	watch(w *Watch) error
	unwatch(w *Watch)
	close() // at the end of run
}

// Start starts cfg.Loops loops, each on its own goroutine locked to its
// OS thread, and returns once every loop is ready.
func Start(cfg Config) (*Group, error) {
	if cfg.Loops <= 0 {
		cfg.Loops = runtime.GOMAXPROCS(0)
	}
	if cfg.BufSize <= 0 {
		cfg.BufSize = DefaultBufSize
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	be := cfg.Backend
	switch be {
	case Auto:
		if err := probeUring(); err != nil {
			cfg.Logger.Warn("evloop: io_uring refused, using epoll", "err", err)
			be = Epoll
		} else {
			be = IOUring
		}
	case IOUring, Epoll:
	default:
		return nil, fmt.Errorf("evloop: unknown backend %d", uint8(be))
	}
	var cpus []int
	if cfg.Pin {
		var err error
		if cpus, err = allowedCPUs(); err != nil {
			return nil, err
		}
	}
	g := &Group{backend: be, holdP: cfg.HoldP, kick: make(chan struct{}, 1), done: make(chan struct{})}
	g.wg.Add(1)
	go g.kicker()
	base := time.Now()
	for i := 0; i < cfg.Loops; i++ {
		l := &Loop{g: g, id: i, bufSize: cfg.BufSize, base: base, log: cfg.Logger, cpu: -1, block: cfg.BlockingWait}
		if cfg.Pin {
			l.cpu = cpus[i%len(cpus)]
		}
		ready := make(chan error, 1)
		g.wg.Add(1)
		go l.run(be, ready)
		if err := <-ready; err != nil {
			g.Close()
			return nil, fmt.Errorf("evloop: start loop %d (%s): %w", i, be, err)
		}
		g.loops = append(g.loops, l)
	}
	return g, nil
}

// Loops returns the group's loops; Loops()[i].ID() == i.
func (g *Group) Loops() []*Loop { return g.loops }

// Backend returns the backend the loops run (never Auto).
func (g *Group) Backend() Backend { return g.backend }

// Stats sums the loops' counters; any goroutine.
func (g *Group) Stats() Stats {
	st := Stats{Loops: len(g.loops)}
	for _, l := range g.loops {
		st.Sockets += int(l.nSocks.Load())
		st.Buffers += int(l.nBufs.Load())
		st.Turns += l.nTurns.Load()
		st.Parks += l.nParks.Load()
		st.KernelWaits += l.nKWaits.Load()
		st.Starved += l.nStarved.Load()
		st.Spliced += l.nSpliced.Load()
		st.Pipes += int(l.nPipes.Load())
	}
	return st
}

// Close stops every loop, closes the sockets they own (no callbacks run)
// and waits for the loops to return; not from a loop's thread (it would
// wait for itself). Listening and watched fds are not
// closed (the caller owns them). It returns the first error a loop died
// of, if any.
func (g *Group) Close() error {
	g.once.Do(func() {
		for _, l := range g.loops {
			l.stop.Store(true)
			l.kick()
		}
		close(g.done)
	})
	g.wg.Wait()
	g.errMu.Lock()
	defer g.errMu.Unlock()
	return g.err
}

// Loop is one event loop. See the package doc for which methods may be
// called from where.
type Loop struct {
	g       *Group
	id      int
	drv     driver
	ep      *epoll // the driver as its concrete type (Sock.Write)
	ur      *uring
	bufSize int
	cpu     int     // pinned to, or -1
	block   bool    // Config.BlockingWait
	pk      *parker // nil with BlockingWait
	base    time.Time
	log     *slog.Logger
	now     int64
	wall    time.Time // Time's reading for this turn, when wallOK
	wallOK  bool

	socks []*Sock // by slot
	gens  []uint32
	free  []uint32

	timers  []*Timer // min-heap on at
	turnEnd []*turnFn
	later   []*Sock              // sockets with deferred work (errors, re-reads, detach)
	wbufs   [outClasses][][]byte // free write-queue buffers by size class
	splices []*splice            // idle splices, most with a pipe
	lent    []byte               // the stash buffer an OnRead reads (uring.readPending)

	listeners []*listener
	watches   []*Watch
	watchGens []uint32 // by watch slot
	watchFree []uint32 // free watch slots

	mu      sync.Mutex
	posted  []func()
	running []func()
	dead    bool // the driver is closed: Post drops
	asleep  atomic.Bool
	stop    atomic.Bool
	// inKernel: the loop waits (or is about to) in the system call
	// rather than parked, so wake goes to the ring/epoll set, not the
	// parker's fd. Set before asleep and cleared after it.
	inKernel atomic.Bool
	// kernelUntil (loop clock) bounds the kernel waits after a park.
	kernelUntil int64
	// kickAt (loop clock) is when a loop that resumed from a park and
	// still holds its P kicks the netpoller for parked loops (kicker.go);
	// 0: no kick due.
	kickAt int64
	rsa    unix.RawSockaddrAny // accept4's peer address

	nSocks   atomic.Int64
	nBufs    atomic.Int64
	nTurns   atomic.Uint64
	nStarved atomic.Uint64
	nParks   atomic.Uint64
	nKWaits  atomic.Uint64
	nWakes   atomic.Uint64 // wake-ups read from the driver's eventfd (tests)
	nPostWk  atomic.Uint64 // wake-ups a Post sent to a sleeping loop (tests)
	nKTimed  atomic.Uint64 // kernel waits bounded by a timeout of their own: a loop timer due within the span (tests)
	nSpliced atomic.Uint64
	nPipes   atomic.Int64
}

// allowedCPUs lists the CPUs the process may run on.
func allowedCPUs() ([]int, error) {
	var set unix.CPUSet
	if err := unix.SchedGetaffinity(0, &set); err != nil {
		return nil, fmt.Errorf("evloop: sched_getaffinity: %w", err)
	}
	var cpus []int
	for c := 0; c < len(set)*64; c++ {
		if set.IsSet(c) {
			cpus = append(cpus, c)
		}
	}
	if len(cpus) == 0 {
		return nil, errors.New("evloop: no CPU in the affinity mask")
	}
	return cpus, nil
}

// ID returns the loop's index in its group.
func (l *Loop) ID() int { return l.id }

// Now returns monotonic nanoseconds, read once per turn right after the
// wait (so handlers, timers and posted functions of a turn see one time).
func (l *Loop) Now() int64 { return l.now }

// Time returns the wall-clock time for this turn: read at its first call
// in a turn and the same for the rest of it, as nginx caches its time once
// per event-loop iteration (a request's timing points cost a clock read
// each otherwise, ~1.5 % of the proxy's CPU at 64 connections). It
// carries a monotonic reading, so differences between turns' Times are
// monotonic; within a turn they are zero.
func (l *Loop) Time() time.Time {
	if !l.wallOK {
		l.wall, l.wallOK = time.Now(), true
	}
	return l.wall
}

// turnFn is one OnTurnEnd registration (a pointer: funcs do not compare).
type turnFn struct{ fn func() }

// OnTurnEnd registers fn to run once at the end of every turn, before the
// loop waits. remove unregisters it (on the loop's thread; a second call
// does nothing); a turn already running the list still runs fn once.
func (l *Loop) OnTurnEnd(fn func()) (remove func()) {
	t := &turnFn{fn: fn}
	l.turnEnd = append(l.turnEnd, t)
	return func() {
		// A new slice, not an edit in place: the turn may be ranging
		// over the old one.
		kept := make([]*turnFn, 0, len(l.turnEnd))
		for _, x := range l.turnEnd {
			if x != t {
				kept = append(kept, x)
			}
		}
		l.turnEnd = kept
	}
}

// Post runs fn on the loop's thread in a later turn; any goroutine. fns
// posted by one goroutine run in order. After the group closed, fn never
// runs.
func (l *Loop) Post(fn func()) {
	l.mu.Lock()
	if !l.dead {
		l.posted = append(l.posted, fn)
		if l.asleep.Load() && l.asleep.Swap(false) {
			l.nPostWk.Add(1)
			l.drv.wake()
		}
	}
	l.mu.Unlock()
}

// kick wakes the loop unless its driver is gone; any goroutine.
func (l *Loop) kick() {
	l.mu.Lock()
	if !l.dead {
		l.drv.wake()
	}
	l.mu.Unlock()
}

func (l *Loop) clock() int64 { return int64(time.Since(l.base)) }

// woke reads the clock once the wait returned, before anything of the
// turn runs (drivers call it).
func (l *Loop) woke() { l.now, l.wallOK = l.clock(), false }

func (l *Loop) run(be Backend, ready chan<- error) {
	defer l.g.wg.Done()
	// Never unlocked: when the loop returns, its thread exits with it
	// rather than going back to the scheduler pinned to one CPU.
	runtime.LockOSThread()
	loopsAlive.Add(1)
	defer loopsAlive.Add(-1)
	l.now = l.clock()
	var err error
	if l.cpu >= 0 {
		var set unix.CPUSet
		set.Set(l.cpu)
		if err := unix.SchedSetaffinity(0, &set); err != nil { // 0: this thread
			ready <- fmt.Errorf("pin to CPU %d: %w", l.cpu, err)
			return
		}
	}
	if be == IOUring {
		l.ur, err = newUring(l)
		l.drv = l.ur
	} else {
		l.ep, err = newEpoll(l)
		l.drv = l.ep
	}
	if err != nil {
		ready <- err
		return
	}
	if !l.block {
		if err := l.startParker(); err != nil {
			l.drv.close()
			ready <- fmt.Errorf("park in the netpoller: %w", err)
			return
		}
	}
	ready <- nil
	err = l.loop()
	l.shutdown()
	if err != nil {
		l.log.Error("evloop: loop died", "loop", l.id, "err", err)
		l.g.errMu.Lock()
		if l.g.err == nil {
			l.g.err = fmt.Errorf("evloop: loop %d: %w", l.id, err)
		}
		l.g.errMu.Unlock()
	}
}

func (l *Loop) loop() error {
	for !l.stop.Load() {
		if l.kickAt != 0 && l.now >= l.kickAt {
			l.kickAt = 0
			if loopsParked.Load() > 0 {
				l.g.kickNetpoll() // busy since a park ended: see kicker.go
			}
		}
		timeout := l.timeout()
		park := false
		if timeout != 0 {
			if l.pk != nil {
				if now := l.clock(); now < l.kernelUntil && l.mayHoldP() {
					if left := l.kernelUntil - now; timeout < 0 || left <= timeout {
						// The span's end ends this wait: on io_uring one
						// TIMEOUT per span, not a timer per wait (see
						// uring.spanAt); on epoll, or where the kernel
						// refused it, the wait's own timeout.
						timeout = -1
						if l.ur == nil || !l.ur.armSpan(l.kernelUntil, now) {
							timeout = left
						}
					}
					l.inKernel.Store(true)
				} else {
					park = true
				}
			}
			l.asleep.Store(true)
			// After asleep (and inKernel): a Post or Close that came
			// before is seen here, one that comes after wakes the wait.
			if l.hasPosted() || l.stop.Load() {
				l.asleep.Store(false)
				l.inKernel.Store(false)
				timeout, park = 0, false
			}
		}
		var err error
		switch {
		case park:
			err = l.pk.wait()
			if l.pk.slept {
				l.kickAt = l.now + resumeKickAfter
			}
			l.kernelUntil = 0
			if l.mayHoldP() {
				l.kernelUntil = l.now + kernelSpan
			}
		case l.inKernel.Load():
			l.nKWaits.Add(1)
			if timeout > 0 {
				l.nKTimed.Add(1)
			}
			if loopsParked.Load() > 0 {
				l.g.kickNetpoll() // this P leaves the scheduler's sight: see kicker.go
			}
			l.kickAt = 0
			loopsInKernel.Add(1)
			_, err = l.drv.poll(timeout)
			loopsInKernel.Add(-1)
		default:
			_, err = l.drv.poll(timeout)
		}
		l.asleep.Store(false)
		l.inKernel.Store(false)
		if err != nil {
			return err
		}
		l.nTurns.Add(1)
		l.runTimers()
		l.runPosted()
		l.runLater()
		for _, t := range l.turnEnd {
			t.fn()
		}
	}
	return nil
}

// timeout is how long the next poll may wait: 0 when work is queued, else
// until the next timer, else no bound.
func (l *Loop) timeout() int64 {
	if len(l.later) > 0 {
		return 0
	}
	if len(l.timers) == 0 {
		return -1
	}
	d := l.timers[0].at - l.clock()
	if d < 0 {
		return 0
	}
	return d
}

func (l *Loop) hasPosted() bool {
	l.mu.Lock()
	n := len(l.posted)
	l.mu.Unlock()
	return n > 0
}

func (l *Loop) runPosted() {
	l.mu.Lock()
	l.posted, l.running = l.running[:0], l.posted
	l.mu.Unlock()
	for i, fn := range l.running {
		l.running[i] = nil
		fn()
	}
}

// shutdown closes every socket without callbacks; the driver goes last.
func (l *Loop) shutdown() {
	for _, s := range l.socks {
		if s != nil {
			if s.detach != nil && s.err == nil && (s.Pending() > 0 || s.isSending()) {
				s.err = ErrClosed // its queued bytes are dropped: the handoff failed
			}
			s.flags |= fClosed
			if s.spl != nil {
				s.spl.detach(s)
			}
			s.dropOut()
			l.drv.release(s)
		}
	}
	l.closePipes()
	l.mu.Lock()
	l.dead = true
	l.posted = nil
	if l.pk != nil {
		l.pk.close()
	}
	l.drv.close()
	l.mu.Unlock()
}

func (l *Loop) startParker() error {
	fd, before, after, err := l.drv.parkFD()
	if err != nil {
		return err
	}
	if l.pk, err = newParker(l, fd); err != nil {
		return err
	}
	l.pk.before, l.pk.after = before, after
	return nil
}

// slot puts s into the table.
func (l *Loop) track(s *Sock) {
	if n := len(l.free); n > 0 {
		s.slot = l.free[n-1]
		l.free = l.free[:n-1]
		l.socks[s.slot] = s
	} else {
		s.slot = uint32(len(l.socks))
		l.socks = append(l.socks, s)
		l.gens = append(l.gens, 0)
	}
	s.gen = l.gens[s.slot]
	l.nSocks.Add(1)
}

// lookup returns the socket of a slot/generation pair from the kernel, or
// nil when it is gone.
func (l *Loop) lookup(slot, gen uint32) *Sock {
	if int(slot) >= len(l.socks) || l.gens[slot]&0xffffff != gen {
		return nil
	}
	return l.socks[slot]
}

// finish frees s's slot once the driver is done with it; then it runs the
// Detach callback or closes the fd.
func (l *Loop) finish(s *Sock) {
	if l.socks[s.slot] != s {
		return
	}
	l.socks[s.slot] = nil
	l.gens[s.slot]++
	l.free = append(l.free, s.slot)
	l.nSocks.Add(-1)
	s.dropOut()
	fd := s.fd
	s.fd = -1
	if fn := s.detach; fn != nil {
		s.detach = nil
		if s.err != nil {
			closeFD(fd)
			fn(-1, s.err)
		} else {
			fn(fd, nil)
			if len(s.stash) > 0 && s.flags&fUnreadTaken == 0 {
				l.log.Error("evloop: bytes received before a Detach were dropped: the Detach callback must take Sock.Unread",
					"bytes", len(s.stash), "fd", fd)
			}
		}
	} else {
		closeFD(fd)
	}
	s.dropStash()
}

// defer queues s for runLater.
func (l *Loop) deferSock(s *Sock) {
	if s.flags&fLater == 0 {
		s.flags |= fLater
		l.later = append(l.later, s)
	}
}

// runLater delivers deferred errors, re-reads resumed or busy sockets and
// completes detaches.
func (l *Loop) runLater() {
	for round := 0; round < 4 && len(l.later) > 0; round++ {
		n := len(l.later)
		for i := 0; i < n; i++ {
			s := l.later[i]
			l.later[i] = nil
			s.flags &^= fLater
			s.deferred()
		}
		m := copy(l.later, l.later[n:])
		clear(l.later[m:])
		l.later = l.later[:m]
	}
}
