// Package udpshard moves datagrams for the RateLimitly client: one shard per
// CPU, each an event loop owning an unconnected UDP socket on its own
// ephemeral port (never shared: no SO_REUSEPORT, see openSocket), with
// batched sendmmsg/recvmmsg through the Go netpoller, delivery of every
// received datagram to one handler (the caller demultiplexes by request id, never by socket), and transactional
// source-port rebinds on steering feedback.
//
// Threading model. Each shard has a send queue, one loop goroutine that
// coalesces sends, performs rebinds, retires old sockets and delivers send
// errors, and one reader goroutine per open socket that receives with
// recvmmsg. The queue is sent with sendmmsg by one goroutine at a time
// (flat combining): datagrams queued during a flush go out in the
// flusher's next batch. There are two ways to get it sent:
//
//   - Flush (and Send) sends at once from the calling goroutine, unless
//     another flush of the shard runs.
//   - FlushAsync hands the queue to the shard loop and returns. The loop,
//     woken at most once per batch, first yields the processor
//     (runtime.Gosched, a bounded number of times and only while the queue
//     keeps growing) so that the other runnable goroutines, typically the
//     requests just woken by a batch of answers, can queue their datagrams,
//     and then sends them all in one sendmmsg. This is what makes sends
//     batch when requests are issued one goroutine at a time on a few
//     CPUs: with Flush each of them would run its own system call.
//
// Sends and receives park in the netpoller (syscall.RawConn callbacks
// return false on EAGAIN), so no goroutine spins or blocks a P in a
// syscall. A reader hands at most MaxBatch datagrams to the handler per
// read turn and yields (runtime.Gosched) after a full batch, so a flood of
// datagrams cannot monopolise a P.
//
// Segmentation offload. Datagrams of one flush that go to the same
// destination with the same size (the last may be shorter) are sent as one
// sendmmsg message with UDP_SEGMENT (UDP GSO): the kernel runs its output
// path once per message and splits it into ordinary datagrams at the
// device (or at the receiving socket on loopback), so receivers see no
// difference. A socket on which the kernel refuses it (no checksum
// offload, IPsec route, segment over the path MTU, old kernel) falls back
// to one message per datagram for good; Config.DisableGSO turns it off.
//
// Rebind protocol. Rebind(sock) only marks the shard pending and wakes its
// loop; it is safe from the handler (the read path). The loop opens and
// registers a replacement socket first, then switches the shard's current
// socket, and closes the old one only once no holder references it and no
// queued datagram still targets it. A failed replacement keeps the working
// socket, leaves the rebind pending and retries with bounded exponential
// backoff. A socket is never closed from its own read path.
package udpshard

import (
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

const (
	// MaxBatch is the largest number of datagrams one sendmmsg/recvmmsg call
	// moves, and the budget of one read turn.
	MaxBatch = 64
	// MaxPayload is the largest datagram Send accepts.
	MaxPayload = 1500
	// recvBufSize is the receive buffer per datagram; larger datagrams are
	// reported truncated by the kernel and dropped.
	recvBufSize = 2048
)

// Errors returned by Send.
var (
	ErrClosed    = errors.New("udpshard: closed")
	ErrQueueFull = errors.New("udpshard: send queue full")
	ErrTooLarge  = errors.New("udpshard: datagram too large")
	ErrFamily    = errors.New("udpshard: destination address family not reachable from the bound socket")
)

// Handler receives one datagram. It runs on a reader goroutine; pkt is valid
// only during the call (the handler may overwrite it). sock is the socket
// that received it (sock.Shard() its shard); the handler may pass it to
// Rebind but must not keep it.
type Handler func(sock *Socket, pkt []byte, from netip.AddrPort)

// Config configures a Ring.
type Config struct {
	Bind             netip.Addr    // local address; invalid = any (dual-stack when possible)
	Shards           int           // 0 = GOMAXPROCS
	Handler          Handler       // required
	QueueLen         int           // per-shard send queue in datagrams; 0 = 1024
	RebindBackoffMin time.Duration // first retry after a failed rebind; 0 = 10ms
	RebindBackoffMax time.Duration // cap of the retry backoff; 0 = 5s
	// RebindMinInterval spaces successful rebinds of one shard: steering
	// feedback arriving sooner is remembered and served when the interval
	// has passed, so an overloaded server cannot cause a rebind storm.
	// 0 = 1s; negative = no spacing.
	RebindMinInterval time.Duration
	// OnSendError, if set, is called from the shard loop goroutine (never
	// from a Send/Flush caller) for each datagram the kernel refused, with
	// the token given to Send.
	OnSendError func(token uint64, err error)
	// DisableGSO sends every datagram as its own sendmmsg message. By
	// default datagrams queued together for the same destination share a
	// UDP_SEGMENT message (see buildMsgs); a socket on which the kernel
	// refuses that falls back by itself.
	DisableGSO bool
	// ReadGate, if set, runs on each socket's reader goroutine before every
	// read turn and may block: tests use it to hold readers back, as a
	// stalled or overloaded process would, while datagrams queue up in the
	// kernel (see Drain). Nil in production.
	ReadGate func(sock *Socket)
	Logger   *slog.Logger
}

// DropCounts counts datagrams dropped, by reason.
type DropCounts struct {
	QueueFull uint64 // send queue full
	TooLarge  uint64 // Send payload over MaxPayload
	Family    uint64 // destination family not reachable from the socket
	SendError uint64 // kernel refused the datagram (sendmmsg error)
	Closed    uint64 // queued for a socket or ring that closed first
	Truncated uint64 // received datagram larger than the receive buffer
	RecvError uint64 // recvmmsg error other than EAGAIN/EINTR
}

// Stats is a snapshot of the ring's counters, summed over shards.
type Stats struct {
	Shards         int
	Sockets        int    // open sockets (current + awaiting retirement)
	Sent           uint64 // datagrams accepted by the kernel
	Received       uint64 // datagrams handed to the handler
	SendBatches    uint64 // sendmmsg calls that sent at least one datagram
	RecvBatches    uint64 // recvmmsg calls that returned at least one datagram
	Rebinds        uint64 // completed source-port switches
	RebindFailures uint64 // replacement sockets that failed to open
	Retired        uint64 // old sockets closed after a rebind
	LoopWakes      uint64 // shard loop iterations for rebind, retire, error delivery
	FlushWakes     uint64 // shard loop iterations for FlushAsync
	FlushYields    uint64 // runtime.Gosched calls of the loop while coalescing sends
	GSOSegments    uint64 // datagrams sent inside segmented (UDP_SEGMENT) messages
	GSOFallbacks   uint64 // sockets on which the kernel refused segmentation
	Dropped        DropCounts
}

type counters struct {
	sent, received, sendBatches, recvBatches     atomic.Uint64
	rebinds, rebindFailures, retired             atomic.Uint64
	queueFull, tooLarge, family, sendErr, closed atomic.Uint64
	truncated, recvErr, loopWakes                atomic.Uint64
	flushWakes, flushYields                      atomic.Uint64
	gsoSegments, gsoFallbacks                    atomic.Uint64
}

// Ring is a set of per-CPU UDP shards.
type Ring struct {
	cfg    Config
	log    *slog.Logger
	shards []*shard
	done   chan struct{}
	wg     sync.WaitGroup
	closed atomic.Bool
	once   sync.Once
	// readers counts reader goroutines (they outlive the loops until their
	// sockets close).
	readers sync.WaitGroup
	// openHook, when set (tests), runs before a rebind opens its socket; an
	// error fails that attempt.
	openHook func(shard int) error
}

// Socket is one UDP socket of a shard. Holders obtained with Hold keep it
// open until Release; it stays usable for sends after a rebind switched
// the shard away from it.
type Socket struct {
	sh     *shard
	file   *os.File
	rc     syscall.RawConn
	fam    int
	dual   bool
	local  netip.AddrPort
	refs   atomic.Int64
	noGSO  atomic.Bool // the kernel refused a segmented send on this socket
	closed bool        // guarded by sh.mu
	rd     *reader
}

// LocalAddr is the socket's bound address and port.
func (s *Socket) LocalAddr() netip.AddrPort { return s.local }

// Shard is the index of the shard owning the socket.
func (s *Socket) Shard() int { return s.sh.idx }

// Release drops one hold taken with Hold.
func (s *Socket) Release() {
	if s.refs.Add(-1) == 0 {
		s.sh.mu.Lock()
		notCurrent := s.sh.cur != s
		s.sh.mu.Unlock()
		if notCurrent {
			s.sh.kick()
		}
	}
}

type sendErr struct {
	token uint64
	err   syscall.Errno
}

// msgGroup describes one sendmmsg message of a run: one datagram, or
// several to the same destination sent with UDP_SEGMENT.
type msgGroup struct {
	to    netip.AddrPort
	seg   int  // segment size (the first datagram's length)
	cnt   int  // datagrams
	bytes int  // payload bytes
	open  bool // may take another datagram (all so far have size seg)
	iov   int  // first iovec
	fill  int  // iovecs placed so far (layout)
}

const (
	// gsoMaxSegments bounds the datagrams of one segmented message (the
	// kernel's UDP_MAX_SEGMENTS is 64 on older kernels).
	gsoMaxSegments = 64
	// gsoMaxSegSize: larger datagrams are sent alone. A segment must fit
	// the path MTU whole (the kernel refuses to fragment it), so only
	// datagrams that fit the IPv6 minimum MTU are grouped.
	gsoMaxSegSize = 1200
	// gsoMaxBytes bounds the payload of one segmented message (it is one
	// IP packet until it is segmented).
	gsoMaxBytes = 60000
	// gsoScan is how many of the latest messages a datagram may join.
	gsoScan = 8
	// gsoCmsgSpace is the control buffer of one message: a UDP_SEGMENT
	// cmsg with a uint16.
	gsoCmsgSpace = (unix.SizeofCmsghdr + 2 + 7) &^ 7
)

type sendSlot struct {
	sock  *Socket
	to    netip.AddrPort
	token uint64
	n     int
	buf   [MaxPayload]byte
}

type shard struct {
	r   *Ring
	idx int
	c   counters

	mu            sync.Mutex
	cur           *Socket
	old           []*Socket
	q             []sendSlot // pending datagrams, len = queued
	qn            int
	rebindPending bool
	flushing      bool      // a goroutine is sending: others only queue
	errs          []sendErr // refused datagrams awaiting OnSendError (loop)
	errTmp        []sendErr // loop-owned copy

	wake chan struct{}
	// fwake wakes the loop to send the queue (FlushAsync); fkicked is set
	// while such a wake is outstanding, so a batch costs one wake-up.
	fwake   chan struct{}
	fkicked atomic.Bool

	// owned by the goroutine that is flushing (flushing = true) or, for
	// the rest, by the loop
	spare      []sendSlot
	msgs       [MaxBatch]unix.Mmsghdr
	iov        [MaxBatch]unix.Iovec
	names      [MaxBatch]unix.RawSockaddrInet6
	ctrl       [MaxBatch][gsoCmsgSpace]byte
	mg         [MaxBatch]msgGroup
	ent        [MaxBatch]int // slot index of each datagram still to send in a run
	entMsg     [MaxBatch]int // message of each ent entry (-1 = dropped)
	iovSlot    [MaxBatch]int // slot index of each iovec
	wbase      int
	wcnt       int
	wn         int
	werr       syscall.Errno
	writeFn    func(fd uintptr) bool
	backoff    time.Duration
	retry      *time.Timer
	lastRebind time.Time
	drain      drainer // Drain's buffers
	// retireWanted: retire was skipped because a flush was running; the
	// flusher wakes the loop when it ends.
	retireWanted bool // guarded by mu
}

// New opens one socket per shard and starts the shard loops.
func New(cfg Config) (*Ring, error) {
	if cfg.Handler == nil {
		return nil, errors.New("udpshard: config: Handler is required")
	}
	if cfg.Shards <= 0 {
		cfg.Shards = runtime.GOMAXPROCS(0)
	}
	if cfg.QueueLen <= 0 {
		cfg.QueueLen = 1024
	}
	if cfg.RebindMinInterval == 0 {
		cfg.RebindMinInterval = time.Second
	}
	if cfg.RebindBackoffMin <= 0 {
		cfg.RebindBackoffMin = 10 * time.Millisecond
	}
	if cfg.RebindBackoffMax < cfg.RebindBackoffMin {
		cfg.RebindBackoffMax = 5 * time.Second
		if cfg.RebindBackoffMax < cfg.RebindBackoffMin {
			cfg.RebindBackoffMax = cfg.RebindBackoffMin
		}
	}
	lg := cfg.Logger
	if lg == nil {
		lg = slog.New(slog.DiscardHandler)
	}
	r := &Ring{cfg: cfg, log: lg, done: make(chan struct{})}
	for i := 0; i < cfg.Shards; i++ {
		s := &shard{
			r:     r,
			idx:   i,
			q:     make([]sendSlot, cfg.QueueLen),
			spare: make([]sendSlot, cfg.QueueLen),
			wake:  make(chan struct{}, 1),
			fwake: make(chan struct{}, 1),
			errs:  make([]sendErr, 0, MaxBatch),
		}
		s.writeFn = s.write
		for j := range s.msgs {
			s.msgs[j].Hdr.Iov = &s.iov[j]
			s.msgs[j].Hdr.SetIovlen(1)
			s.msgs[j].Hdr.Name = (*byte)(unsafe.Pointer(&s.names[j]))
		}
		sock, err := r.open(s)
		if err != nil {
			r.closeAll()
			return nil, fmt.Errorf("udpshard: shard %d: %w", i, err)
		}
		s.cur = sock
		r.shards = append(r.shards, s)
	}
	for _, s := range r.shards {
		r.wg.Add(1)
		go s.loop()
	}
	return r, nil
}

// Shards is the number of shards.
func (r *Ring) Shards() int { return len(r.shards) }

// LocalAddr is the current bound address of a shard's socket.
func (r *Ring) LocalAddr(shard int) netip.AddrPort {
	s := r.shards[shard]
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cur.local
}

// Hold returns the shard's current socket with one more hold on it; the
// caller sends a request's datagrams through it and calls Release when the
// request is retired, so a rebind never closes a socket a request may
// still use.
func (r *Ring) Hold(shard int) *Socket {
	s := r.shards[shard]
	s.mu.Lock()
	sock := s.cur
	sock.refs.Add(1)
	s.mu.Unlock()
	return sock
}

// Push queues one datagram on sock (copying pkt) without sending it; a
// later Flush of sock's shard sends it. token is handed back to
// Config.OnSendError if the kernel refuses the datagram.
func (r *Ring) Push(sock *Socket, to netip.AddrPort, pkt []byte, token uint64) error {
	return sock.sh.enqueue(sock, to, pkt, token)
}

// Flush sends the shard's queued datagrams with sendmmsg now, unless
// another goroutine is already flushing that shard (it then sends them in
// its next batch). It does not block on the network except when the socket
// buffer is full, and then parks in the netpoller.
func (r *Ring) Flush(shard int) { r.shards[shard].flush() }

// FlushAsync asks the shard's loop to send the queued datagrams and
// returns at once. The loop lets other runnable goroutines queue theirs
// first (a bounded number of runtime.Gosched calls, only while the queue
// grows) and sends them together, so datagrams pushed by many goroutines
// share sendmmsg calls. Calls before the loop has taken the queue cost no
// extra wake-up. When the queue already holds MaxBatch datagrams the caller
// sends them itself, as Flush does.
func (r *Ring) FlushAsync(shard int) {
	s := r.shards[shard]
	if s.queued() >= MaxBatch {
		s.flush()
		return
	}
	if s.fkicked.Load() || !s.fkicked.CompareAndSwap(false, true) {
		return // a wake-up is outstanding: the loop has not taken the queue yet
	}
	select {
	case s.fwake <- struct{}{}:
	default:
	}
}

// Send is Push followed by Flush.
func (r *Ring) Send(sock *Socket, to netip.AddrPort, pkt []byte, token uint64) error {
	if err := sock.sh.enqueue(sock, to, pkt, token); err != nil {
		return err
	}
	sock.sh.flush()
	return nil
}

// PushCurrent queues one datagram on the shard's current socket without
// sending it (see Push and Flush).
func (r *Ring) PushCurrent(shard int, to netip.AddrPort, pkt []byte, token uint64) error {
	return r.shards[shard].enqueue(nil, to, pkt, token)
}

// SendCurrent sends one datagram on the shard's current socket (for
// fire-and-forget traffic that holds no socket).
func (r *Ring) SendCurrent(shard int, to netip.AddrPort, pkt []byte, token uint64) error {
	s := r.shards[shard]
	if err := s.enqueue(nil, to, pkt, token); err != nil {
		return err
	}
	s.flush()
	return nil
}

// Drain reads, on the calling goroutine, the datagrams already queued on
// the shard's open sockets (current and switched-out ones) and hands them
// to the handler, at most MaxBatch per read turn and a bounded number of
// turns. A read turn of a socket's reader goroutine in progress is
// delivered first, so when Drain returns every datagram the kernel had
// queued for the shard before the call has reached the handler (unless a
// socket holds more than the turn bound). It never blocks on the network.
// A caller about to act on the absence of an answer (a deadline) calls it
// so that answers that arrived while the readers could not run (a
// stalled or overloaded process) count. It must not be called from the
// handler.
func (r *Ring) Drain(shard int) {
	s := r.shards[shard]
	var socks [8]*Socket
	list := socks[:0]
	s.mu.Lock()
	if s.cur != nil && !s.cur.closed {
		list = append(list, s.cur)
	}
	for _, o := range s.old {
		if !o.closed {
			list = append(list, o)
		}
	}
	s.mu.Unlock()
	s.drain.mu.Lock()
	defer s.drain.mu.Unlock()
	for _, sock := range list {
		s.drain.drain(sock)
	}
}

// Rebind asks for a safe source-port change of sock's shard if sock is still
// the shard's current socket (steering feedback about an already replaced
// socket is ignored). It never blocks and is safe from the Handler.
func (r *Ring) Rebind(sock *Socket) {
	s := sock.sh
	s.mu.Lock()
	if s.cur == sock && !s.rebindPending {
		s.rebindPending = true
		s.mu.Unlock()
		s.kick()
		return
	}
	s.mu.Unlock()
}

// Stats sums the shard counters.
func (r *Ring) Stats() Stats {
	st := Stats{Shards: len(r.shards)}
	for _, s := range r.shards {
		c := &s.c
		st.Sent += c.sent.Load()
		st.Received += c.received.Load()
		st.SendBatches += c.sendBatches.Load()
		st.RecvBatches += c.recvBatches.Load()
		st.Rebinds += c.rebinds.Load()
		st.RebindFailures += c.rebindFailures.Load()
		st.Retired += c.retired.Load()
		st.LoopWakes += c.loopWakes.Load()
		st.FlushWakes += c.flushWakes.Load()
		st.FlushYields += c.flushYields.Load()
		st.GSOSegments += c.gsoSegments.Load()
		st.GSOFallbacks += c.gsoFallbacks.Load()
		st.Dropped.QueueFull += c.queueFull.Load()
		st.Dropped.TooLarge += c.tooLarge.Load()
		st.Dropped.Family += c.family.Load()
		st.Dropped.SendError += c.sendErr.Load()
		st.Dropped.Closed += c.closed.Load()
		st.Dropped.Truncated += c.truncated.Load()
		st.Dropped.RecvError += c.recvErr.Load()
		s.mu.Lock()
		if s.cur != nil && !s.cur.closed {
			st.Sockets++
		}
		for _, o := range s.old {
			if !o.closed {
				st.Sockets++
			}
		}
		s.mu.Unlock()
	}
	return st
}

// Close stops the shard loops, closes every socket and waits for the
// goroutines to exit. Queued datagrams are dropped. Idempotent.
func (r *Ring) Close() error {
	r.once.Do(func() {
		r.closed.Store(true)
		close(r.done)
		r.wg.Wait() // loops exit; readers exit when their sockets close
		r.closeAll()
		r.readers.Wait()
	})
	return nil
}

func (r *Ring) closeAll() {
	for _, s := range r.shards {
		s.mu.Lock()
		if s.cur != nil {
			s.closeSocketLocked(s.cur)
		}
		for _, o := range s.old {
			s.closeSocketLocked(o)
		}
		s.old = nil
		s.mu.Unlock()
	}
}

// open opens a socket for shard s and starts its reader.
func (r *Ring) open(s *shard) (*Socket, error) {
	if r.openHook != nil {
		if err := r.openHook(s.idx); err != nil {
			return nil, err
		}
	}
	f, rc, fam, dual, local, err := openSocket(r.cfg.Bind)
	if err != nil {
		return nil, err
	}
	sock := &Socket{sh: s, file: f, rc: rc, fam: fam, dual: dual, local: local}
	rd := newReader(sock, r.cfg.Handler, r.cfg.ReadGate)
	sock.rd = rd
	r.readers.Add(1)
	go func() {
		defer r.readers.Done()
		rd.run()
	}()
	return sock, nil
}

func (s *shard) kick() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

func (s *shard) enqueue(sock *Socket, to netip.AddrPort, pkt []byte, token uint64) error {
	if len(pkt) > MaxPayload {
		s.c.tooLarge.Add(1)
		return ErrTooLarge
	}
	s.mu.Lock()
	if s.r.closed.Load() {
		s.mu.Unlock()
		s.c.closed.Add(1)
		return ErrClosed
	}
	if sock == nil {
		sock = s.cur
	}
	if !reachable(sock, to) {
		s.mu.Unlock()
		s.c.family.Add(1)
		return ErrFamily
	}
	if s.qn == len(s.q) {
		s.mu.Unlock()
		s.c.queueFull.Add(1)
		return ErrQueueFull
	}
	sl := &s.q[s.qn]
	s.qn++
	sl.sock = sock
	sl.to = to
	sl.token = token
	sl.n = copy(sl.buf[:], pkt)
	s.mu.Unlock()
	return nil
}

func reachable(sock *Socket, to netip.AddrPort) bool {
	a := to.Addr()
	if !a.IsValid() || to.Port() == 0 {
		return false
	}
	if sock.fam == unix.AF_INET {
		return a.Unmap().Is4()
	}
	return sock.dual || !a.Unmap().Is4()
}

// loop is the shard's event loop: flush, rebind, retire.
func (s *shard) loop() {
	defer s.r.wg.Done()
	s.retry = time.NewTimer(time.Hour)
	s.retry.Stop()
	defer s.retry.Stop()
	for {
		select {
		case <-s.r.done:
			s.dropQueued()
			return
		case <-s.fwake:
			s.c.flushWakes.Add(1)
			s.coalesce()
			s.fkicked.Store(false) // later FlushAsync calls wake us again
			s.flush()
			if !s.hasLoopWork() {
				continue
			}
		case <-s.wake:
		case <-s.retry.C:
		}
		s.c.loopWakes.Add(1)
		s.flush()
		s.deliverErrors()
		s.maybeRebind()
		s.retire()
	}
}

// maxCoalesceYields bounds the yields of one coalescing round.
const maxCoalesceYields = 4

// coalesce gives the goroutines that are runnable now the chance to queue
// their datagrams before the loop sends: it yields the processor while the
// queue keeps growing, at most maxCoalesceYields times and never once it
// holds MaxBatch datagrams. On an idle machine the first yield returns at
// once and finds nothing new.
func (s *shard) coalesce() {
	n := s.queued()
	for i := 0; i < maxCoalesceYields && n < MaxBatch; i++ {
		runtime.Gosched()
		s.c.flushYields.Add(1)
		m := s.queued()
		if m == n {
			return
		}
		n = m
	}
}

// queued is the number of datagrams waiting in the queue.
func (s *shard) queued() int {
	s.mu.Lock()
	n := s.qn
	s.mu.Unlock()
	return n
}

// hasLoopWork reports whether errors await delivery or switched-out
// sockets await retirement, so that the flush path goes on with a full
// loop turn. A pending rebind is not loop work here: Rebind wakes the
// loop itself, and a rebind deferred by RebindMinInterval or a backoff
// has the retry timer armed.
func (s *shard) hasLoopWork() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.errs) > 0 || len(s.old) > 0
}

func (s *shard) dropQueued() {
	s.mu.Lock()
	n := s.qn
	for i := 0; i < n; i++ {
		s.q[i].sock = nil
	}
	s.qn = 0
	s.mu.Unlock()
	s.c.closed.Add(uint64(n))
}

// flush sends everything queued, in sendmmsg batches of consecutive
// datagrams for the same socket. Only one goroutine flushes a shard at a
// time; a concurrent caller returns at once and its datagrams go out in the
// active flusher's next round.
func (s *shard) flush() {
	s.mu.Lock()
	if s.flushing {
		s.mu.Unlock()
		return
	}
	s.flushing = true
	for {
		n := s.qn
		if n == 0 {
			s.flushing = false
			wake := s.retireWanted || len(s.errs) > 0
			s.retireWanted = false
			s.mu.Unlock()
			if wake {
				s.kick() // retire / error delivery happen on the loop
			}
			return
		}
		batch := s.q
		s.q, s.spare = s.spare, batch
		s.qn = 0
		s.mu.Unlock()
		s.sendSlots(batch[:n])
		for i := range batch[:n] {
			batch[i].sock = nil
		}
		s.mu.Lock()
	}
}

// deliverErrors runs OnSendError for refused datagrams (loop goroutine).
func (s *shard) deliverErrors() {
	s.mu.Lock()
	s.errTmp = append(s.errTmp[:0], s.errs...)
	s.errs = s.errs[:0]
	s.mu.Unlock()
	if cb := s.r.cfg.OnSendError; cb != nil {
		for _, e := range s.errTmp {
			cb(e.token, e.err)
		}
	}
}

// sendSlots sends slots in runs of consecutive datagrams for the same
// socket, at most MaxBatch per run.
func (s *shard) sendSlots(slots []sendSlot) {
	for i := 0; i < len(slots); {
		sock := slots[i].sock
		j := i + 1
		for j < len(slots) && slots[j].sock == sock && j-i < MaxBatch {
			j++
		}
		s.sendRun(sock, slots[i:j])
		i = j
	}
}

// sendRun sends up to MaxBatch datagrams that all go out through sock. It
// packs them into sendmmsg messages (buildMsgs) and, if the kernel
// refuses segmentation offload, sends what is left again without it.
func (s *shard) sendRun(sock *Socket, slots []sendSlot) {
	n := len(slots)
	for e := range n {
		s.ent[e] = e
	}
	for n > 0 {
		nm := s.buildMsgs(sock, slots, n)
		failed := s.sendMsgs(sock, slots, nm)
		if failed < 0 {
			return
		}
		// Messages before failed went out; resend the datagrams of the
		// others one by one (sock.noGSO is now set).
		k := 0
		for e := range n {
			if s.entMsg[e] >= failed {
				s.ent[k] = s.ent[e]
				k++
			}
		}
		n = k
	}
}

// buildMsgs fills s.msgs with the datagrams slots[s.ent[0:n]] and returns
// the number of messages. Unless segmentation offload is off, datagrams to
// the same destination share one message sent with UDP_SEGMENT (GSO): the
// kernel splits its payload into datagrams of the first one's size (all
// but the last must have exactly that size), so the network stack is
// traversed once per message rather than once per datagram. The iovecs of
// one message point at the slots' buffers (no copy).
func (s *shard) buildMsgs(sock *Socket, slots []sendSlot, n int) int {
	gso := !s.r.cfg.DisableGSO && !sock.noGSO.Load()
	nm := 0
	for e := range n {
		sl := &slots[s.ent[e]]
		m := -1
		if gso && sl.n > 0 && sl.n <= gsoMaxSegSize {
			for k := nm - 1; k >= 0 && k >= nm-gsoScan; k-- {
				g := &s.mg[k]
				if g.open && g.to == sl.to && sl.n <= g.seg && g.cnt < gsoMaxSegments && g.bytes+sl.n <= gsoMaxBytes {
					m = k
					break
				}
			}
		}
		if m < 0 {
			nl := putSockaddr(&s.names[nm], sock.fam, sock.dual, sl.to)
			if nl == 0 { // checked at enqueue; defensive
				s.c.family.Add(1)
				s.entMsg[e] = -1
				continue
			}
			m = nm
			nm++
			s.msgs[m].Hdr.Namelen = nl
			s.mg[m] = msgGroup{to: sl.to, seg: sl.n, open: gso && sl.n > 0 && sl.n <= gsoMaxSegSize}
		}
		g := &s.mg[m]
		s.entMsg[e] = m
		g.cnt++
		g.bytes += sl.n
		if sl.n < g.seg { // a short segment can only be the last one
			g.open = false
		}
	}
	// Lay the iovecs of each message out contiguously, in queue order.
	base := 0
	for m := range nm {
		g := &s.mg[m]
		g.iov, g.fill = base, 0
		base += g.cnt
	}
	for e := range n {
		m := s.entMsg[e]
		if m < 0 {
			continue
		}
		g := &s.mg[m]
		k := g.iov + g.fill
		g.fill++
		sl := &slots[s.ent[e]]
		s.iov[k].Base = &sl.buf[0]
		s.iov[k].SetLen(sl.n)
		s.iovSlot[k] = s.ent[e]
	}
	for m := range nm {
		g := &s.mg[m]
		h := &s.msgs[m].Hdr
		h.Iov = &s.iov[g.iov]
		h.SetIovlen(g.cnt)
		if g.cnt > 1 {
			c := &s.ctrl[m]
			cm := (*unix.Cmsghdr)(unsafe.Pointer(&c[0]))
			cm.Level = unix.SOL_UDP
			cm.Type = unix.UDP_SEGMENT
			cm.SetLen(unix.CmsgLen(2))
			*(*uint16)(unsafe.Pointer(&c[unix.CmsgLen(0)])) = uint16(g.seg)
			h.Control = &c[0]
			h.SetControllen(gsoCmsgSpace)
		} else {
			h.Control = nil
			h.SetControllen(0)
		}
	}
	return nm
}

// sendMsgs sends the built messages. It returns -1 when every message was
// handed to the kernel (or refused and accounted for), or the index of
// a segmented message the kernel refused as such: segmentation offload is
// then turned off for sock and the caller resends from there.
func (s *shard) sendMsgs(sock *Socket, slots []sendSlot, nm int) int {
	off := 0
	for off < nm {
		s.wn, s.werr = 0, 0
		s.wbase = off
		s.wcnt = nm
		if err := sock.rc.Write(s.writeFn); err != nil { // socket closed under us
			for m := off; m < nm; m++ {
				s.c.closed.Add(uint64(s.mg[m].cnt))
			}
			return -1
		}
		if s.werr != 0 {
			g := &s.mg[off]
			if g.cnt > 1 && gsoRefused(s.werr) {
				if !sock.noGSO.Swap(true) {
					s.c.gsoFallbacks.Add(1)
					s.r.log.Info("udpshard: UDP segmentation offload refused, sending datagrams one by one on this socket",
						"shard", s.idx, "local", sock.local, "err", s.werr)
				}
				return off
			}
			s.c.sendErr.Add(uint64(g.cnt))
			if s.r.cfg.OnSendError != nil {
				s.mu.Lock()
				for k := g.iov; k < g.iov+g.cnt && len(s.errs) < cap(s.errs); k++ {
					s.errs = append(s.errs, sendErr{token: slots[s.iovSlot[k]].token, err: s.werr})
				}
				s.mu.Unlock()
			}
			off++
			continue
		}
		var sent, seg uint64
		for m := off; m < off+s.wn; m++ {
			c := uint64(s.mg[m].cnt)
			sent += c
			if c > 1 {
				seg += c
			}
		}
		s.c.sent.Add(sent)
		s.c.gsoSegments.Add(seg)
		s.c.sendBatches.Add(1)
		off += s.wn
	}
	return -1
}

// gsoRefused reports whether a sendmmsg error on a UDP_SEGMENT message
// means the kernel, device or route cannot segment it (no checksum
// offload, an IPsec route, a segment over the path MTU, an old kernel).
func gsoRefused(e syscall.Errno) bool {
	switch e {
	case unix.EIO, unix.EINVAL, unix.EMSGSIZE, unix.ENOPROTOOPT, unix.EOPNOTSUPP:
		return true
	}
	return false
}

// write is the RawConn.Write callback (allocated once per shard).
func (s *shard) write(fd uintptr) bool {
	for {
		n, e := sendmmsg(fd, s.msgs[s.wbase:s.wcnt])
		switch e {
		case 0:
			s.wn = n
			return true
		case unix.EINTR:
			continue
		case unix.EAGAIN:
			return false
		default:
			s.werr = e
			return true
		}
	}
}

func (s *shard) maybeRebind() {
	s.mu.Lock()
	pending := s.rebindPending
	s.mu.Unlock()
	if !pending || s.r.closed.Load() {
		return
	}
	if gap := s.r.cfg.RebindMinInterval; gap > 0 && !s.lastRebind.IsZero() {
		if wait := gap - time.Since(s.lastRebind); wait > 0 {
			s.retry.Reset(wait)
			return
		}
	}
	sock, err := s.r.open(s)
	if err != nil {
		s.c.rebindFailures.Add(1)
		if s.backoff == 0 {
			s.backoff = s.r.cfg.RebindBackoffMin
		} else if s.backoff *= 2; s.backoff > s.r.cfg.RebindBackoffMax {
			s.backoff = s.r.cfg.RebindBackoffMax
		}
		s.r.log.Warn("udpshard: rebind failed, keeping current socket", "shard", s.idx, "retry_in", s.backoff, "err", err)
		s.retry.Reset(s.backoff)
		return
	}
	s.backoff = 0
	s.lastRebind = time.Now()
	s.mu.Lock()
	old := s.cur
	s.cur = sock
	s.old = append(s.old, old)
	s.rebindPending = false
	s.mu.Unlock()
	s.c.rebinds.Add(1)
	s.r.log.Debug("udpshard: rebound", "shard", s.idx, "from", old.local, "to", sock.local)
}

// retire closes switched-out sockets that nobody holds and no queued
// datagram targets. It runs only on the shard loop, never on a read path.
func (s *shard) retire() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.old) == 0 {
		return
	}
	if s.flushing { // a flusher may be sending on an old socket
		s.retireWanted = true
		return
	}
	keep := s.old[:0]
	for _, o := range s.old {
		if o.refs.Load() == 0 && !s.queuedForLocked(o) {
			s.closeSocketLocked(o)
			s.c.retired.Add(1)
			continue
		}
		keep = append(keep, o)
	}
	for i := len(keep); i < len(s.old); i++ {
		s.old[i] = nil
	}
	s.old = keep
}

func (s *shard) queuedForLocked(o *Socket) bool {
	for i := 0; i < s.qn; i++ {
		if s.q[i].sock == o {
			return true
		}
	}
	return false
}

func (s *shard) closeSocketLocked(o *Socket) {
	if o.closed {
		return
	}
	o.closed = true
	o.file.Close() // wakes the reader, which then exits
}
