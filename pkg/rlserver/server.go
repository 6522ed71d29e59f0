// Package rlserver is a RateLimitly-compatible wire v1 server: token buckets
// and latency guards answered over UDP by per-CPU SO_REUSEPORT workers with
// batched receive and send (see docs/protocol.md §6 for the semantics).
//
// It is the embedded backend for single-node and demo use and the peer of
// every client test: Start it on "127.0.0.1:0", read Addr, Close it.
//
// Two ways to run the sockets. By default (the standalone server,
// `rl-tproxy ratelimitly-server`, and tests) each socket has a worker goroutine that
// parks in the netpoller. With Config.Driven (the embedded server inside
// the proxy) no goroutine is started: an owner, one of the proxy's event
// loops, watches Socket.FD and calls Socket.Serve on its own thread, which
// reads a bounded number of batches without waiting, decides and answers
// them there (loop.go). Sockets, wire, state and answers are the same in
// both; with GOMAXPROCS=1 the driven mode answers a check sent by a loop
// on that loop, with no goroutine switch or thread hand-off.
package rlserver

import (
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"net/netip"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rl-tproxy/rl-tproxy/pkg/ratelimitly/credentials"
	"github.com/rl-tproxy/rl-tproxy/pkg/ratelimitly/wire"
)

// Defaults of the memory bounds.
const (
	DefaultMaxBuckets    = 1 << 20
	DefaultMaxTrackers   = 1 << 16
	DefaultDedupCapacity = 1 << 17
	// MaxDedupCapacity bounds Config.DedupCapacity: 2^25 ids take about
	// 4.5 GiB (DedupBytesPerID each) once the ring has filled.
	MaxDedupCapacity = 1 << 25
	// DedupBytesPerID is the memory one remembered id takes: its ring slot
	// (the answer's body inline) and its share of the index.
	DedupBytesPerID = 128 + 16
	// OverloadTurns full read batches in a row make a worker overloaded:
	// its answers carry steering_feedback = 0 until a read turn is not full.
	OverloadTurns = 4
	drainTurns    = 16 // read turns a closing worker spends on queued datagrams
)

// Config configures a Server.
type Config struct {
	Listen      string // UDP address; "127.0.0.1:0" for embedded use and tests
	Credentials []credentials.Credential
	Workers     int // sockets/goroutines; 0 = GOMAXPROCS
	// Driven starts no worker goroutine: each socket is served by an
	// owner that polls it (an event loop; Server.Sockets, loop.go).
	Driven bool
	Now    func() time.Time // injectable clock; nil = time.Now
	Hooks  *TestHooks       // nil in production

	// Batch is the most datagrams per read and write turn (1..64, 0 = 64).
	// 1 turns batching off (for the batching benchmark).
	Batch int
	// Memory bounds (0 = the defaults above).
	MaxBuckets, MaxTrackers, DedupCapacity int
	// SweepInterval is how often idle state is dropped (0 = 1 s).
	SweepInterval time.Duration
	Logger        *slog.Logger // nil = discard
}

// TestHooks let tests misbehave on purpose. All may be nil.
type TestHooks struct {
	// DropRequest pretends the (authenticated) datagram was lost.
	DropRequest func(h *wire.Header) bool
	// MutateResponse edits a decision before it is encoded and cached.
	MutateResponse func(resp *wire.RateResponse)
	// ForceSteer makes the answer carry steering_feedback = 0.
	ForceSteer func(h *wire.Header) bool
}

type keyEntry struct {
	key          *wire.Key
	prefix       []byte // u16 length + tenant: the namespace of buckets and trackers
	maxHorizonMs int64  // 0 = none
}

// Server is a running RateLimitly-compatible server.
type Server struct {
	cfg      Config
	now      func() time.Time
	log      *slog.Logger
	epoch    uint64
	skewMs   int64
	keys     map[uint32]*keyEntry
	buckets  *table[bucket]
	trackers *table[tracker]
	dedup    *dedupTable
	workers  []*worker
	sockets  []*Socket // Driven: one per worker
	addr     netip.AddrPort

	closing   atomic.Bool
	closeOnce sync.Once
	wg        sync.WaitGroup
	stop      chan struct{}
	janitor   sync.WaitGroup
}

// Start validates cfg, binds one SO_REUSEPORT socket per worker on the same
// address and starts serving.
func Start(cfg Config) (*Server, error) {
	if len(cfg.Credentials) == 0 {
		return nil, errors.New("rlserver: no credentials")
	}
	if cfg.Workers < 0 {
		return nil, fmt.Errorf("rlserver: workers %d < 0", cfg.Workers)
	}
	if cfg.Batch < 0 || cfg.Batch > MaxBatch {
		return nil, fmt.Errorf("rlserver: batch %d outside 1..%d", cfg.Batch, MaxBatch)
	}
	if cfg.Workers == 0 {
		cfg.Workers = runtime.GOMAXPROCS(0)
	}
	if cfg.Batch == 0 {
		cfg.Batch = MaxBatch
	}
	if cfg.MaxBuckets <= 0 {
		cfg.MaxBuckets = DefaultMaxBuckets
	}
	if cfg.MaxTrackers <= 0 {
		cfg.MaxTrackers = DefaultMaxTrackers
	}
	if cfg.DedupCapacity <= 0 {
		cfg.DedupCapacity = DefaultDedupCapacity
	}
	if cfg.DedupCapacity > MaxDedupCapacity {
		return nil, fmt.Errorf("rlserver: dedup capacity %d: at most %d", cfg.DedupCapacity, MaxDedupCapacity)
	}
	if cfg.SweepInterval <= 0 {
		cfg.SweepInterval = time.Second
	}
	s := &Server{
		cfg:    cfg,
		now:    cfg.Now,
		log:    cfg.Logger,
		skewMs: wire.DefaultSkew.Milliseconds(),
		keys:   make(map[uint32]*keyEntry, len(cfg.Credentials)),
		stop:   make(chan struct{}),
	}
	if s.now == nil {
		s.now = time.Now
	}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	for _, c := range cfg.Credentials {
		if _, dup := s.keys[c.KeyID]; dup {
			return nil, fmt.Errorf("rlserver: duplicate key_id %d", c.KeyID)
		}
		if len(c.Tenant) > math.MaxUint16 {
			return nil, fmt.Errorf("rlserver: key_id %d: tenant name too long", c.KeyID)
		}
		k, err := wire.NewKey(c.KeyID, c.Secret)
		if err != nil {
			return nil, fmt.Errorf("rlserver: %w", err)
		}
		p := append([]byte{byte(len(c.Tenant) >> 8), byte(len(c.Tenant))}, c.Tenant...)
		s.keys[c.KeyID] = &keyEntry{key: k, prefix: p, maxHorizonMs: c.MaxHorizon.Milliseconds()}
	}
	s.buckets = newTable(cfg.MaxBuckets, func(b *bucket) int64 { return b.used }, func(b *bucket, now int64) bool { return b.full(now) })
	s.trackers = newTable(cfg.MaxTrackers, func(t *tracker) int64 { return t.used }, func(t *tracker, now int64) bool { return t.empty(now) })
	s.dedup = newDedup(cfg.DedupCapacity)

	ap, err := resolve(cfg.Listen)
	if err != nil {
		return nil, fmt.Errorf("rlserver: listen %q: %w", cfg.Listen, err)
	}
	if ap.Port() == 0 {
		// Linux may give a port-0 SO_REUSEPORT bind a port that another
		// SO_REUSEPORT socket of the same user already holds (another
		// embedded server, say), and would then split datagrams between
		// the two. Take a port no socket holds, then build the group on it.
		port, err := freeUDPPort(ap.Addr())
		if err != nil {
			return nil, fmt.Errorf("rlserver: listen %s: %w", ap, err)
		}
		ap = netip.AddrPortFrom(ap.Addr(), port)
	}
	if err := s.bind(ap); err != nil {
		return nil, err
	}
	s.epoch = uint64(s.now().UnixMilli())
	if cfg.Driven {
		for _, w := range s.workers {
			s.sockets = append(s.sockets, &Socket{w: w})
		}
	} else {
		for _, w := range s.workers {
			s.wg.Add(1)
			go w.run()
		}
	}
	s.janitor.Add(1)
	go s.sweeper()
	s.log.Info("ratelimitly server started", "addr", s.addr.String(), "workers", cfg.Workers, "driven", cfg.Driven,
		"batch", cfg.Batch, "epoch_ms", s.epoch)
	return s, nil
}

// bind opens the cfg.Workers sockets of the SO_REUSEPORT group on ap
// (whose port is not 0) and makes a worker of each.
func (s *Server) bind(ap netip.AddrPort) error {
	for i := 0; i < s.cfg.Workers; i++ {
		bc, err := s.bindOne(ap)
		if err != nil {
			s.closeConns()
			return fmt.Errorf("rlserver: socket of worker %d: %w", i, err) // err names ap
		}
		if i == 0 {
			if s.addr, err = localAddrPort(bc.fd); err != nil {
				bc.close()
				return fmt.Errorf("rlserver: listen %s: %w", ap, err)
			}
			s.addr = netip.AddrPortFrom(s.addr.Addr().Unmap(), s.addr.Port())
		}
		s.workers = append(s.workers, newWorker(s, i, bc))
	}
	return nil
}

// bindOne opens one socket of the group: a raw one when Driven, else one
// in the netpoller.
func (s *Server) bindOne(ap netip.AddrPort) (*batchConn, error) {
	if s.cfg.Driven {
		fd, err := bindReusePort(ap)
		if err != nil {
			return nil, err
		}
		return newDrivenConn(fd), nil
	}
	c, err := listenReusePort(ap)
	if err != nil {
		return nil, err
	}
	bc, err := newBatchConn(c)
	if err != nil {
		c.Close()
		return nil, err
	}
	// The netpoller's dup is what reads; fd is only for the address.
	if rerr := bc.rc.Control(func(fd uintptr) { bc.fd = int(fd) }); rerr != nil {
		c.Close()
		return nil, rerr
	}
	return bc, nil
}

func resolve(listen string) (netip.AddrPort, error) {
	if ap, err := netip.ParseAddrPort(listen); err == nil {
		return ap, nil
	}
	ua, err := net.ResolveUDPAddr("udp", listen)
	if err != nil {
		return netip.AddrPort{}, err
	}
	if ua.IP == nil {
		return netip.AddrPortFrom(netip.IPv4Unspecified(), uint16(ua.Port)), nil
	}
	ap := ua.AddrPort()
	return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port()), nil
}

// Addr is the bound UDP address (with the real port when Listen had port 0).
func (s *Server) Addr() netip.AddrPort { return s.addr }

// Epoch is server_epoch: the start time in unix ms.
func (s *Server) Epoch() uint64 { return s.epoch }

// Close stops reading, answers what is already queued (bounded), and
// closes the sockets. It is idempotent.
func (s *Server) Close() error {
	s.closeOnce.Do(func() {
		s.closing.Store(true)
		past := time.Unix(1, 0)
		if s.cfg.Driven {
			for _, k := range s.sockets {
				k.serverClosed()
			}
		} else {
			for _, w := range s.workers {
				_ = w.bc.conn.SetReadDeadline(past)
				_ = w.bc.conn.SetWriteDeadline(time.Now().Add(time.Second))
			}
		}
		s.wg.Wait()
		if s.cfg.Driven {
			for _, k := range s.sockets {
				k.closeIfFree()
			}
		} else {
			s.closeConns()
		}
		close(s.stop)
		s.janitor.Wait()
		s.log.Info("ratelimitly server stopped", "addr", s.addr.String())
	})
	return nil
}

func (s *Server) closeConns() {
	for _, w := range s.workers {
		w.bc.close()
	}
}

func (s *Server) sweeper() {
	defer s.janitor.Done()
	t := time.NewTicker(s.cfg.SweepInterval)
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
			s.sweep()
		}
	}
}

// sweep drops buckets that refilled to capacity, trackers without samples
// in the window and expired request ids.
func (s *Server) sweep() {
	now := s.now()
	s.buckets.sweep(now.UnixNano())
	s.trackers.sweep(now.UnixNano())
	s.dedup.sweep(now.UnixMilli())
}

// Stats is a snapshot of the server's counters.
type Stats struct {
	Workers            int
	Received           uint64 // datagrams read
	ReadBatches        uint64 // read turns that returned datagrams
	Coalesced          uint64 // datagrams that arrived several in one message (UDP_GRO)
	ReadErrors         uint64
	Requests           uint64 // RATE_REQUESTs decided (not replays)
	Allows, Denies     uint64
	Malformed          uint64 // answered with status MALFORMED
	Replays            uint64 // answered from the dedup cache
	Reports            uint64 // LATENCY_REPORT datagrams applied
	ReportEntries      uint64
	Completions        uint64 // COMPLETION datagrams accepted
	CompletionsApplied uint64 // for an id not seen before
	CompletionsIgnored uint64 // for an id already seen
	Responses          uint64 // datagrams sent
	SendErrors         uint64
	Steered            uint64 // responses with steering_feedback = 0
	Drops              map[string]uint64
	Buckets, Trackers  int64 // live keys
	DedupEntries       int64
	BucketEvictions    uint64
	TrackerEvictions   uint64
	DedupEvictedLive   uint64 // ids forgotten before their time (capacity)
	// The tables' bounds: MaxBuckets, MaxTrackers, and the ids the dedup
	// ring holds (Config.DedupCapacity rounded down to a multiple of 64).
	BucketCapacity, TrackerCapacity, DedupCapacity int
}

// Stats returns the current counters.
func (s *Server) Stats() Stats {
	var c [numCounters]uint64
	for _, w := range s.workers {
		for i := range c {
			c[i] += w.c[i].Load()
		}
	}
	st := Stats{
		Workers:            len(s.workers),
		Received:           c[cReceived],
		ReadBatches:        c[cReadBatches],
		Coalesced:          c[cCoalesced],
		ReadErrors:         c[cReadErrors],
		Requests:           c[cRequests],
		Allows:             c[cAllows],
		Denies:             c[cDenies],
		Malformed:          c[cMalformed],
		Replays:            c[cReplays],
		Reports:            c[cReports],
		ReportEntries:      c[cReportEntries],
		Completions:        c[cCompletions],
		CompletionsApplied: c[cCompletionsApplied],
		CompletionsIgnored: c[cCompletionsIgnored],
		Responses:          c[cResponses],
		SendErrors:         c[cSendErrors],
		Steered:            c[cSteered],
		Drops:              make(map[string]uint64, numDrops),
		Buckets:            s.buckets.count.Load(),
		Trackers:           s.trackers.count.Load(),
		DedupEntries:       s.dedup.count.Load(),
		BucketEvictions:    s.buckets.evictions.Load(),
		TrackerEvictions:   s.trackers.evictions.Load(),
		DedupEvictedLive:   s.dedup.evictedLive.Load(),
		BucketCapacity:     s.cfg.MaxBuckets,
		TrackerCapacity:    s.cfg.MaxTrackers,
		DedupCapacity:      s.dedup.capacity(),
	}
	for r := drop(0); r < numDrops; r++ {
		var n uint64
		for _, w := range s.workers {
			n += w.d[r].Load()
		}
		st.Drops[dropNames[r]] = n
	}
	return st
}

// Dropped is the total of all drop reasons.
func (st Stats) Dropped() uint64 {
	var n uint64
	for _, v := range st.Drops {
		n += v
	}
	return n
}

// nonce fills n from the system CSPRNG.
func nonce(n *[wire.NonceLen]byte) error {
	_, err := rand.Read(n[:])
	return err
}
