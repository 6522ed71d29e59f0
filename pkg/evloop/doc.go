// Package evloop runs per-CPU event loops: each loop is one goroutine
// locked to its OS thread that owns non-blocking sockets, calls their
// handlers on that thread, and batches the system calls of a turn.
//
// It is the syscall layer of the HTTP/1.1 data path and knows nothing of
// HTTP.
//
// # Backends
//
// Config.Backend selects how a loop talks to the kernel:
//
//   - IOUring: one ring per loop. Listeners get one multishot accept,
//     sockets one multishot recv drawing from the loop's registered
//     provided-buffer ring (an idle socket holds no buffer), writes are
//     send submissions of the bytes queued during the turn, Watch is a
//     multishot POLL_ADD, and a turn ends with ONE io_uring_enter that
//     submits everything the turn queued and waits for the next
//     completion.
//   - Epoll: one edge-triggered epoll set per loop. Reads go into the
//     loop's scratch buffer (an idle socket holds no buffer); a read
//     shorter than the buffer ends the read burst (the next arrival raises
//     a new edge, so no read returns EAGAIN on the common path); Write
//     writes at once and queues only what the kernel did not take.
//   - Auto (the zero value) picks IOUring and falls back to Epoll at Start
//     when the kernel or a seccomp profile refuses io_uring
//     (io_uring_setup failing with EPERM, ENOSYS, EINVAL, ... as with
//     kernel.io_uring_disabled=2 or a container runtime's default
//     profile). The fallback is logged once per Start;
//     Group.Backend reports the backend actually running.
//
// # Threads
//
// Post is the only Loop method that may be called from any goroutine. Every
// other method of Loop, Sock, Timer and Watch must be called on the loop's
// thread: from a handler, a timer, a Watch callback, an OnTurnEnd function
// or a function given to Post. Handlers run on the loop thread and MUST
// NOT block (no blocking system call, no channel receive, no lock held by
// another goroutine for long): while one runs, every socket of the loop
// waits. Hand blocking work to a goroutine and Post its result back.
//
// A loop with nothing to do parks in Go's netpoller: a turn ends with a
// non-blocking epoll_wait / io_uring_enter(GETEVENTS) and, when that
// found nothing, the loop goroutine waits on a pollable fd that turns
// readable when the loop has work (for epoll a second epoll set, the
// park set, that holds the loop's set with interest in it only while the
// loop parks; for io_uring an eventfd registered with the ring, disabled
// with IORING_CQ_EVENTFD_DISABLED while the loop runs): neither wakes the
// netpoller for a loop that runs or waits in the kernel. The loop's P is
// then free at once for the goroutines whose answers the loop waits for (an
// admission client's receiver, a blocking hook's worker); a wait inside
// the system call would hold the P until the runtime's monitor retakes it
// (20 µs to 10 ms with GOMAXPROCS=1). The goroutine stays locked to its
// thread (io_uring's SINGLE_ISSUER binds the ring to it), so a wake-up
// from the netpoller hands the P to the loop's thread.
//
// No wake-up waits for a timer or a deferred kernel callback. With epoll
// the socket's readiness wakes the netpoller's epoll_wait through the
// nested sets (the loop's set inside the park set). With io_uring a
// completion is task work of the loop thread (COOP_TASKRUN, not
// DEFER_TASKRUN): the kernel wakes the thread where it sleeps, the
// thread posts the completion and signals the registered eventfd in its
// own context, and the netpoller wakes. (With
// DEFER_TASKRUN only the registered eventfd could wake a thread waiting
// outside io_uring_enter, and the kernel signals it from an RCU callback,
// 4-20 ms late.) TestParkedLoopWakesAtOnce holds a parked loop's echo to
// within 10x a goroutine's through the netpoller.
//
// A park costs the netpoller's epoll_wait and two thread hand-offs, which
// one request at a time pays on every wait. So for 1 ms after a park the
// loop waits inside epoll_wait/io_uring_enter instead, as a raw system
// call bounded by the rest of that span: the thread sleeps in the kernel,
// keeps its P and is not handed off (an announced blocking call would
// have the runtime's monitor give the P to another thread after 20 µs).
// Post wakes such a wait through the ring's or the epoll set's own
// eventfd. Once the span is over the next idle wait parks. One
// IORING_OP_TIMEOUT, armed when the span's first kernel wait begins,
// ends the span; a wait does not carry a timeout of its own unless a
// loop timer is due before the span ends (an enter's timeout arms a
// kernel timer and cancels it at the wake-up, and a timer due within the
// millisecond is the CPU's next event: each reprograms the timer
// device, on a virtual machine an exit each time, on the request's path
// at one request at a time). A kernel that refuses the TIMEOUT is asked
// once, logged, and its waits carry their own timeout, as every epoll
// wait in the span does. A loop waits in the kernel only while the
// process has a P that no loop holds
// (GOMAXPROCS above the number of running loops, e.g. rl-tproxy run
// --event-loops below it) or Config.HoldP reports that no goroutine needs
// one (checked before every wait): otherwise goroutines woken by the
// netpoller (HTTP/2 connections, an admission client's receiver) would
// find no P until the loop parks, and loops park at once. Goroutines that
// need a P while HoldP says none does (timers, an admin request, the
// garbage collector's workers) wait for the span's end. A signal (the runtime's
// preemption, a stop-the-world) ends a kernel wait with EINTR; with
// GODEBUG=asyncpreemptoff=1 a stop-the-world may wait for the span.
//
// A loop's turn runs on the thread the netpoller hands the P to, and the
// thread that polled then stops (the loop goroutine is locked to its
// own), so while a loop runs or waits in the kernel holding its P
// another parked loop has nobody polling for it unless the runtime
// starts a thread, which it sees no reason to do: its readiness waited
// for sysmon's 10 ms poll or the first loop's next park. So a loop that
// parks or starts a kernel wait while another loop is in the other
// state, or stays busy for 200 µs after a park while another is parked,
// wakes the group's kicker goroutine; the thread the runtime starts for
// it then polls (kicker.go; TestWokenLoopKicksForParkedLoop).
//
// Stats.Parks counts the parks that slept (the first check found nothing),
// Stats.KernelWaits the kernel waits entered. Config.BlockingWait
// restores the announced wait inside the system call (for measurements).
//
// # API
//
//	type Backend uint8 // Auto, IOUring, Epoll; String()
//	type Config struct {
//		Loops        int          // default runtime.GOMAXPROCS(0)
//		Backend      Backend
//		BufSize      int          // receive buffer size (default 16 KiB)
//		Logger       *slog.Logger // default slog.Default()
//		Pin          bool         // bind loop i's thread to the i-th allowed CPU
//		BlockingWait bool         // wait in the system call, holding the P (measurements)
//		HoldP        func(*Loop) bool // no goroutine needs a P: idle loop l may wait in the kernel
//	}
//	func Start(cfg Config) (*Group, error)
//	func ProbeIOUring() error // nil when Auto would pick IOUring
//	func (g *Group) Loops() []*Loop
//	func (g *Group) Backend() Backend   // the one actually running
//	func (g *Group) Stats() Stats       // any goroutine
//	func (g *Group) Close() error       // stops all loops, closes their sockets, waits
//
//	// Any goroutine:
//	func (l *Loop) Post(fn func())      // run fn on l's thread in a later turn (wakes it)
//	func (l *Loop) ID() int
//	// Loop thread only:
//	func (l *Loop) Listen(fd int, h AcceptHandler) error // fd may be shared by several loops
//	func (l *Loop) Unlisten(fd int)                      // stop accepting on fd; does not close fd
//	func (l *Loop) Add(fd int, h Handler) (*Sock, error) // connected non-blocking socket; reading armed
//	func (l *Loop) Connect(fd int, sa unix.Sockaddr, h Handler) (*Sock, error)
//	func (l *Loop) Watch(fd int, onReadable func()) (*Watch, error)
//	func (w *Watch) Stop()
//	func (l *Loop) OnTurnEnd(fn func()) (remove func()) // once at the end of every turn, before waiting
//	func (l *Loop) Now() int64          // monotonic ns, cached per turn
//	type Timer struct{ ... }            // embeddable, zero allocation
//	func (t *Timer) Init(l *Loop, fn func())
//	func (t *Timer) Reset(at int64)     // absolute, in Now's clock
//	func (t *Timer) Stop()
//
//	type AcceptHandler interface{ OnAccept(l *Loop, fd int, remote netip.AddrPort) }
//	type Handler interface {
//		OnConnect(s *Sock, err error) // only for Connect; on err the loop closes s after it returns
//		OnRead(s *Sock, b []byte)     // b valid only during the call
//		OnEOF(s *Sock)                // peer shut its write side; s stays open for writing
//		OnError(s *Sock, err error)   // reset, failed write...; the loop closes s after it returns
//		OnDrained(s *Sock)            // Pending went from > 0 to 0
//	}
//	func (s *Sock) Write(bufs ...[]byte) // never blocks; order preserved
//	func (s *Sock) Pending() int         // bytes queued, not yet handed to the kernel
//	func (s *Sock) PauseRead()           // no OnRead/OnEOF while paused
//	func (s *Sock) ResumeRead()
//	func (s *Sock) CloseWrite()          // shutdown(SHUT_WR) after the queued writes
//	func (s *Sock) Close()               // no more callbacks; drops unwritten bytes
//	func (s *Sock) Detach(fn func(fd int, err error))
//	func (s *Sock) Unread() []byte       // in the Detach callback: bytes received, not delivered
//	func (s *Sock) SpliceTo(dst *Sock, n int64) error // next n bytes received go to dst by splice(2)
//	func (s *Sock) Splicing() bool
//	func (s *Sock) SpliceMoved() int64   // progress of the current splice
//	func (s *Sock) Buffered() bool       // bytes from the peer wait unread
//	type SpliceHandler interface{ OnSpliced(s *Sock, moved int64, err error) }
//	func (s *Sock) FD() int
//	func (s *Sock) Loop() *Loop
//	func (s *Sock) SetData(v any)        // per-socket state of the handler
//	func (s *Sock) Data() any
//
// # Sockets
//
// A Sock is an entry of its loop's table: a slot and a generation, which
// is what the kernel carries back (epoll data, io_uring user_data), so an
// event for a closed socket whose fd number was reused is recognised and
// dropped. A Sock must not be used after Close or Detach (its methods then
// do nothing).
//
// Write copies what the kernel does not take at once into a buffer the
// socket holds only while bytes are queued; Pending is the backpressure
// signal (stop producing above a bound, continue in OnDrained). Queue
// buffers come from the loop in size classes (BufSize to 64 x BufSize)
// and go back to it: a queue that needs room moves its unsent bytes to
// the front of its buffer, or into a larger one while a send still reads
// the old, so it holds a few times its unsent bytes at most, even when a
// stream never lets it empty, and a long stream does not allocate.
//
// One OnRead never delivers more than the loop's BufSize, on either
// backend. PauseRead takes effect at once: no OnRead or OnEOF comes until
// ResumeRead, even later in the same call that delivers stashed bytes.
// A paused socket whose peer sends without end holds a bounded amount of
// data in user space: nothing with epoll (the bytes wait in the kernel);
// with io_uring at most 4 x BufSize (64 KiB with the default BufSize),
// what its multishot recv took before the pause took effect: PauseRead
// submits the recv's cancel at once, not with the turn's enter, and
// every multishot recv is limited to 4 x BufSize bytes before the loop
// re-arms it (IORING_RECV_MSHOT_LIM). On a kernel that refuses that limit
// (EINVAL) the loop logs it once and reads without it; a paused socket
// then keeps what its recv took in the kernel's last burst (the
// provided-buffer ring, 256 x BufSize, at worst). ResumeRead delivers
// what was stashed in pieces of at most BufSize and stops as soon as the
// handler pauses again.
//
// Close discards queued bytes: to close after a response, call
// CloseWrite and Close in OnDrained (or after the peer's EOF). CloseWrite
// during a Connect shuts the write side once connected. Detach
// leaves the loop without closing: fn runs on the loop thread once the
// queued bytes reached the kernel and no operation is in flight on the
// fd, with the non-blocking fd (for os.NewFile + net.FileConn), or with
// fd -1 and the error when a write failed (the loop closed the fd), or
// with fd -1 and ErrClosed when the group closed before the queued bytes
// were written. With io_uring the socket's multishot recv may take bytes before its
// cancel completes: the callback finds them in s.Unread() and owns them
// (they come before anything read from the fd). A callback that leaves
// such bytes untaken is logged as an error: they are lost.
//
// # Splice
//
// src.SpliceTo(dst, n) moves the next n bytes src receives into dst
// without a copy through user space: splice(2) from src into a pipe and
// from the pipe into dst, both non-blocking, from the loop thread, on
// either backend (io_uring's IORING_OP_SPLICE always runs in an io-wq
// worker thread: a hand-off per call). The bytes follow what dst had
// queued; src gets no OnRead until the splice ends, and its handler, a
// SpliceHandler, then gets OnSpliced with the bytes moved and why it
// ended (all moved, src's EOF or error, dst gone: ErrSpliceDst). It
// waits for src by its edge (epoll) or a POLL_ADD (io_uring, whose
// multishot recv is cancelled first; what it took meanwhile goes to dst
// through the queue first), and for dst likewise; a splice moves at most
// 1 MiB before the rest of the turn runs. A pipe holds at most
// SplicePipeSize bytes in flight; each loop keeps up to 16 idle pipes.
// Closing either socket ends the splice and drops what the pipe held.
// Buffered reports bytes from the peer not yet read (kernel queue or
// stash): the proxy checks it after a spliced body, so that bytes an
// upstream sent past its Content-Length poison the connection as they do
// on the copying path.
//
// No heap allocation happens per read, write, splice or timer event in
// steady state (see the allocation tests); the loop allocates per
// connection (the Sock) and when a queue outgrows its buffer. The stash
// of a paused io_uring socket comes from the queue buffers' free lists.
package evloop
