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
//     While a reader of the shard is handing a read turn to the handler,
//     FlushAsync leaves the queue to that reader, which sends it when the
//     turn ends: what the turn's datagrams caused (checks ended and new
//     ones started from their completions) goes out in one sendmmsg with
//     no hand-off to the loop.
//
// Owned mode. Shards 0..Config.Owned-1 have no reader goroutine: their
// sockets (the current one, switched-out ones kept for late answers, and
// those later rebinds open) are read by the thread that Owns the shard,
// an event loop seen through the Owner interface (Watch, Post): when a
// socket turns readable it runs recvmmsg until the socket is empty and
// hands every datagram to its handler on that thread. The owner sends
// what was queued during its turn with FlushOwned at the turn's end (one
// sendmmsg, one UDP_SEGMENT message per destination; never parking: what
// a full send buffer refuses stays queued, in order, for the owner's next
// FlushOwned, within the queue's bound). Rebinds and retirements still run
// on the shard loop, which hands new sockets to the owner and leaves the
// closing of watched ones to it (Post); Drain from another goroutine
// still reads them (with Config.Handler). Shards nobody owns keep the
// goroutine mode.
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
// Receive offload. Sockets have UDP_GRO on (Config.DisableGRO turns it
// off): datagrams a sender segmented (pkg/rlserver answers a read turn's
// requests from one client socket in one UDP_SEGMENT message) arrive as
// one buffer, which the reader splits by the segment size the kernel
// reports and hands over datagram by datagram. The buffers then have room
// for one IP packet each (64 KiB, groBatch of them per socket, mapped
// apart from the Go heap so only filled pages are resident).
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
	Bind   netip.Addr // local address; invalid = any (dual-stack when possible)
	Shards int        // 0 = GOMAXPROCS
	// Owned puts shards 0..Owned-1 in owned mode: no reader goroutine;
	// their sockets are read by the thread that Owns the shard (owned.go).
	Owned            int
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
	// DisableGRO keeps UDP_GRO off, so the kernel hands over every
	// datagram in its own buffer. By default it is on where the kernel
	// has it: datagrams a sender segmented (as pkg/rlserver does with its
	// answers) arrive in one buffer per segmented message and are split
	// here (see rx.go).
	DisableGRO bool
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
	Received       uint64 // datagrams handed to the handler (counted once a received batch is handled)
	SendBatches    uint64 // sendmmsg calls that sent at least one datagram
	RecvBatches    uint64 // recvmmsg calls that returned at least one datagram
	Rebinds        uint64 // completed source-port switches
	RebindFailures uint64 // replacement sockets that failed to open
	Retired        uint64 // old sockets closed after a rebind
	LoopWakes      uint64 // shard loop iterations for rebind, retire, error delivery
	FlushWakes     uint64 // shard loop iterations for FlushAsync
	FlushYields    uint64 // runtime.Gosched calls of the loop while coalescing sends
	TurnFlushes    uint64 // queue sends by a reader at the end of its read turn
	TurnFlushHits  uint64 // FlushAsync calls left to a delivering reader (no loop wake-up)
	GSOSegments    uint64 // datagrams sent inside segmented (UDP_SEGMENT) messages
	GSOFallbacks   uint64 // sockets on which the kernel refused segmentation
	GRODatagrams   uint64 // datagrams received inside coalesced (UDP_GRO) buffers
	SendBlocked    uint64 // owned flushes stopped by a full send buffer (FlushOwned)
	Requeued       uint64 // datagrams such flushes kept queued for a later one
	Dropped        DropCounts
}

type counters struct {
	sent, received, sendBatches, recvBatches     atomic.Uint64
	rebinds, rebindFailures, retired             atomic.Uint64
	queueFull, tooLarge, family, sendErr, closed atomic.Uint64
	truncated, recvErr, loopWakes                atomic.Uint64
	flushWakes, flushYields                      atomic.Uint64
	turnFlushes, turnFlushHits                   atomic.Uint64
	gsoSegments, gsoFallbacks                    atomic.Uint64
	groDatagrams, sendBlocked, requeued          atomic.Uint64
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
	gro    bool        // UDP_GRO is on: a received buffer may hold several datagrams
	closed bool        // guarded by sh.mu
	rd     *reader
	fd     int // the descriptor (owned mode watches it)
	// watched: the shard's owner watches the socket (guarded by sh.mu);
	// stop ends that watch (owner's thread).
	watched bool
	stop    func()
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
	// delivering counts the shard's reader goroutines that are handing
	// a read turn to the handler; each sends the queue when its turn
	// ends, so FlushAsync needs no loop wake-up meanwhile (see
	// reader.run).
	delivering atomic.Int32

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

	own        ownState         // owned mode (owned.go)
	nowait     bool             // the flusher must not park (FlushOwned); flusher-owned
	blocked    bool             // a full send buffer stopped the nowait flush; flusher-owned
	ctlWriteFn func(fd uintptr) // s.writeNoWait (allocated once)
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
	if cfg.Owned > cfg.Shards {
		return nil, fmt.Errorf("udpshard: config: %d owned shards of %d", cfg.Owned, cfg.Shards)
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
		s.ctlWriteFn = s.writeNoWait
		s.own.owned = i < cfg.Owned
		s.own.reapFn = s.reap
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
// sends them itself, as Flush does. While a reader goroutine of the shard
// is handing received datagrams to the handler (which is where most
// checks start or end under load), the reader sends the queue at the end
// of that read turn instead: no hand-off, and everything the turn's
// datagrams caused goes out in one sendmmsg.
func (r *Ring) FlushAsync(shard int) {
	s := r.shards[shard]
	if s.queued() >= MaxBatch {
		s.flush()
		return
	}
	if s.delivering.Load() > 0 {
		// A reader of the shard is delivering a read turn (this may be
		// its own handler): it sends the queue when the turn ends. The
		// datagram was queued before this load, and the reader looks at
		// the queue after its decrement, so it cannot be missed.
		s.c.turnFlushHits.Add(1)
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
	if r.closed.Load() {
		return // sockets closed, buffers given back
	}
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
	if r.closed.Load() {
		return // Close gives the buffers back under this lock
	}
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

// Close stops the shard loops, closes every socket and waits for the
// goroutines to exit. Queued datagrams are dropped. Idempotent.
func (r *Ring) Close() error {
	r.once.Do(func() {
		r.closed.Store(true)
		close(r.done)
		r.wg.Wait() // loops exit; readers exit when their sockets close
		r.closeAll()
		r.readers.Wait()
		for _, s := range r.shards {
			s.drain.mu.Lock()
			s.drain.release()
			s.drain.mu.Unlock()
		}
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
	var rb *rxBatch
	if !r.cfg.DisableGRO {
		// Buffers for coalesced datagrams first: UDP_GRO goes on only
		// with room for what it delivers. Without it: one datagram per
		// buffer.
		if b, err := newRxBatch(true); err == nil {
			var serr error
			err := rc.Control(func(fd uintptr) { serr = unix.SetsockoptInt(int(fd), unix.SOL_UDP, unix.UDP_GRO, 1) })
			if err == nil && serr == nil {
				sock.gro, rb = true, b
			} else {
				b.release()
			}
		}
	}
	if rb == nil {
		rb, _ = newRxBatch(false) // heap buffers: cannot fail
	}
	if err := rc.Control(func(fd uintptr) { sock.fd = int(fd) }); err != nil {
		f.Close()
		rb.release()
		return nil, fmt.Errorf("udp socket %s: %w", local, err)
	}
	if s.own.owned {
		// Read by the owner (owned.go) with the shard's buffers.
		rb.release()
		sock.rd = newReader(sock, r.cfg.Handler, nil, nil)
		return sock, nil
	}
	rd := newReader(sock, r.cfg.Handler, r.cfg.ReadGate, rb)
	sock.rd = rd
	r.readers.Add(1)
	go func() {
		defer r.readers.Done()
		rd.run()
	}()
	return sock, nil
}
