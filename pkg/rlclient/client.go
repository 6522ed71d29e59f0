// Package rlclient is the RateLimitly client: it discovers the servers of a
// deployment by DNS SRV, sends each rate check to every endpoint through
// per-CPU UDP shards (pkg/udpshard), follows a request policy (fan-out,
// replay, final receive, completion delivery) and returns exactly one
// decision or failure cause per check; it also sends latency reports.
//
// # Discovery
//
// The SRV name is looked up through the configured resolver (or
// /etc/resolv.conf), then A/AAAA of each target unless the answer carries
// glue. Every usable A and AAAA address of every SRV target, with the
// target's SRV port, is one endpoint (only families the bind address can
// reach are considered; an address listed twice for one target is one
// endpoint). Membership is strict: a failed lookup, an empty answer, a "."
// target, port 0, a target without a usable address, duplicate targets or
// an address shared by two targets are errors; there is never a fallback
// address. Lookups run in
// one background goroutine: refresh after the smallest record TTL clamped
// to [MinRefresh, MaxRefresh] (5 s .. 5 min); a failed lookup is retried
// after 0.5 s doubling to 5 s; the last-known-good membership is used for
// up to LastKnownGood (10 min) after it was fetched, then dropped.
//
// # Request engine
//
// A valid answer is an authenticated, timely RATE_RESPONSE from the
// endpoint, echoing the request, whose body decodes, whose status is OK and
// whose result arrays have the request's cardinality. Any other answer
// (status MALFORMED, OVER_QUOTA, UNAVAILABLE, a cardinality mismatch, an
// undecodable body) is not valid: the endpoint is still missing.
//
// Check sends the request to every usable endpoint (see health.go:
// endpoints that missed their last MissLimit requests are left out and
// probed in the background; with none usable, to all). It decides early
// when the oldest known usable endpoint (smallest server_epoch seen so
// far) gives a valid answer, or when every endpoint it sent to has answered
// and one answer is valid. At the end of each round it decides with the
// valid answer of the smallest server_epoch if there is one, else replays
// (same request id, attempt+1, replay bit) to the endpoints without a valid
// answer, and after the last replay round receives only for FinalReceive,
// deciding on the first valid answer. At the horizon (or once every
// endpoint answered the last send and none validly) it fails with the most
// specific cause seen (cardinality > protocol/authentication > send failure
// > timeout). After a decision a COMPLETION (decision + original request)
// goes to every endpoint it sent to without a valid answer, when the policy
// enables completion delivery.
//
// CheckAsync runs the same check without a waiting goroutine: it returns
// at once and calls the caller's Completer exactly once (from the receive
// or timer goroutine that ended the check, or from Abort or Close); Check
// is CheckAsync and a wait. This is what an event loop uses: it never
// blocks on RateLimitly.
//
// # Event loops
//
// With Config.LoopShards = n the client has, besides its goroutine
// shards, one shard per event loop (udpshard owned mode): AttachLoop
// (pkg/proxy's LoopAttacher) gives shard i to loop i, which then reads
// its sockets itself (no reader goroutine). CheckAsyncLoop, called on a
// loop's thread, queues the check's datagrams on that loop's shard and
// leaves them there: the loop sends everything its turn queued at the
// end of the turn (one sendmmsg, one UDP_SEGMENT message per endpoint).
// An answer the loop reads ends its check on the loop; the Completer is
// called after the read, outside the client's locks, through
// LoopCompleter.CheckDoneOnLoop when it has it, so the caller can go on
// inline: no Post, no wake-up, no other thread. The deadlines of such a
// check (replays, final receive, the horizon) are kept by its loop shard
// and run on the loop (one loop timer armed for the earliest, see
// loopdl.go): a replay leaves with the turn's send, a timeout reaches
// CheckDoneOnLoop. Stats.LoopDone counts the checks ended on their loop;
// Stats.LoopHandoffs those ended on another thread (Abort, Close, a
// Drain, or a deadline after the loop detached: detaching hands the
// pending deadlines to the shard's timer goroutine). When the shard's
// socket has a full send buffer, what the turn queued waits in the
// shard's queue, in order (udpshard FlushOwned), and the loop sends it
// at its next turns; an idle loop wakes itself to retry (a short
// backoff). Probes, reports and checks from goroutines (Check,
// CheckAsync, pkg/h2proxy) use the goroutine shards.
//
// A check's datagrams are queued on its shard; under load the shard's
// loop sends the datagrams of many checks together (udpshard FlushAsync:
// one sendmmsg, one UDP_SEGMENT message per endpoint), with about one
// check per shard in flight the check sends them itself.
//
// Request state is pooled and time is kept by one timer goroutine per
// shard with a min-heap of deadlines (a loop's checks: by the loop): no
// goroutine or timer per request, and zero allocations per Check,
// CheckAsync or CheckAsyncLoop in steady state. Before it acts on a due
// deadline the timer goroutine reads the answers already queued on its
// shard's sockets (udpshard Drain), so that answers that arrived while the
// readers could not run (a stalled or overloaded process) still decide
// instead of being replayed or timed out; a loop runs its due deadlines
// after the turn's reads, for the same reason. A response may arrive on
// any shard's socket: it is matched by request id through a shared table,
// then authenticated, and matched to an endpoint by source address.
// Steering feedback (steering_feedback = 0 in an authenticated answer)
// asks the sending shard for a safe source-port rebind (udpshard).
package rlclient

import (
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rl-tproxy/rl-tproxy/pkg/ratelimitly"

	"github.com/rl-tproxy/rl-tproxy/pkg/ratelimitly/credentials"
	"github.com/rl-tproxy/rl-tproxy/pkg/ratelimitly/wire"
	"github.com/rl-tproxy/rl-tproxy/pkg/udpshard"
)

// Config configures a Client.
type Config struct {
	SRV             string // SRV name of the deployment, e.g. _ratelimitly._udp.example.com
	Resolver        string // "" = /etc/resolv.conf; else IP[:port][,IP[:port]...]
	ResolverTimeout time.Duration
	Credential      credentials.Credential
	Policy          ratelimitly.RequestPolicy // zero = Standard(DefaultUnit)
	Bind            netip.Addr                // local address of the UDP sockets; invalid = any
	Logger          *slog.Logger

	Shards int // UDP/timer shards for checks from goroutines; 0 = GOMAXPROCS
	// LoopShards adds that many shards, one per event loop (shard i for
	// the loop whose ID is i, see AttachLoop and CheckAsyncLoop); 0 =
	// none.
	LoopShards int
	QueueLen   int   // per-shard send queue; 0 = udpshard default
	Clock      Clock // nil = wall clock
}

// Stats is a snapshot of the client's counters.
type Stats struct {
	Ready          bool
	Endpoints      int
	Lookups        uint64
	LookupFailures uint64
	LKGExpired     uint64 // times the last-known-good membership aged out
	Checks         uint64
	InFlight       int64
	Causes         [numCauses]uint64 // per Cause
	Replays        uint64            // replay datagrams sent
	Completions    uint64            // completion datagrams sent
	Reports        uint64            // report datagrams queued
	ReportsDropped uint64            // reports not sent (no endpoints, invalid, queue full)
	Steers         uint64            // answers that asked for a source-port change
	Usable         int               // endpoints in the usable set now
	Probes         uint64            // probe datagrams sent to unusable endpoints
	ProbeAnswers   uint64            // valid answers to probes
	DecidedEarly   uint64            // decisions taken on an answer (no deadline waited for)
	DecidedAtUnit  uint64            // decisions taken at a round deadline (a missing endpoint was waited for)
	LoopDone       uint64            // loop checks whose end was handed to their Completer on their loop's thread
	LoopHandoffs   uint64            // loop checks that ended on another thread (Abort, Close, Drain, a deadline after detach)
	FailureWarns   uint64            // warnings logged about checks failing for lack of RateLimitly
	PerEndpoint    []EndpointStats   // the current membership, in discovery order
	Drops          RecvDrops
	Ring           udpshard.Stats
}

// EndpointStats is what the client knows about one endpoint.
type EndpointStats struct {
	Endpoint
	Usable bool
	Epoch  uint64 // latest server_epoch seen (0 = unknown)
	Chosen uint64 // decisions taken with its answer
}

// RecvDrops counts received datagrams that did not affect a request.
type RecvDrops struct {
	Malformed     uint64 // bad header
	Kind          uint64 // not a RATE_RESPONSE
	UnknownID     uint64 // no live request with this id (late answers; their epoch is still learned)
	Auth          uint64 // failed to open (wrong key or forged)
	Stale         uint64 // timestamp outside the window
	Body          uint64 // body failed to decode
	Echo          uint64 // header does not echo the request (attempt, ttl, replay bit)
	UnknownSource uint64 // not from an endpoint of the request's membership
	Duplicate     uint64 // endpoint already answered this request
}

type counters struct {
	checks, replays, completions, reports, reportsDropped, steers        atomic.Uint64
	probes, probeAnswers, decidedEarly, decidedAtUnit, warns             atomic.Uint64
	inflight                                                             atomic.Int64
	loopDone, loopHandoffs                                               atomic.Uint64
	causes                                                               [numCauses]atomic.Uint64
	malformed, kind, unknownID, auth, stale, body, echo, unknownSrc, dup atomic.Uint64
}

// Client is a RateLimitly client. It is safe for concurrent use.
type Client struct {
	cfg     Config
	policy  ratelimitly.RequestPolicy
	horizon time.Duration
	ttlMs   uint16
	key     *wire.Key
	clock   Clock
	log     *slog.Logger
	ring    *udpshard.Ring
	disc    *discovery
	shards  []*shardEngine
	nLoop   int          // shards 0..nLoop-1 are the loops' (LoopShards)
	loops   []*loopShard // by loop ID
	table   reqTable
	pool    reqPool
	next    atomic.Uint32
	probeID atomic.Uint64 // request id of the latest probe round
	warn    failWarn
	c       counters
	closed  atomic.Bool
	once    sync.Once
	done    chan struct{}
	wg      sync.WaitGroup
}

// New validates cfg, opens the UDP shards and starts discovery in the
// background; it does not wait for the first lookup (see Ready).
func New(cfg Config) (*Client, error) {
	if cfg.SRV == "" {
		return nil, errors.New("rlclient: config: SRV name is required")
	}
	if cfg.Policy.Unit == 0 && cfg.Policy.Name == "" {
		cfg.Policy = ratelimitly.Standard(ratelimitly.DefaultUnit)
	}
	if err := cfg.Policy.Validate(cfg.Credential); err != nil {
		return nil, fmt.Errorf("rlclient: %w", err)
	}
	key, err := wire.NewKey(cfg.Credential.KeyID, cfg.Credential.Secret)
	if err != nil {
		return nil, fmt.Errorf("rlclient: credential %s: %w", cfg.Credential, err)
	}
	res, err := newResolver(cfg.Resolver, cfg.ResolverTimeout)
	if err != nil {
		return nil, fmt.Errorf("rlclient: %w", err)
	}
	lg := cfg.Logger
	if lg == nil {
		lg = slog.New(slog.DiscardHandler)
	}
	clk := cfg.Clock
	if clk == nil {
		clk = realClock{}
	}
	c := &Client{cfg: cfg, policy: cfg.Policy, key: key, clock: clk, log: lg, done: make(chan struct{})}
	c.horizon = cfg.Policy.Horizon()
	c.ttlMs = uint16(ratelimitly.CeilMs(c.horizon))
	c.table.init(stripesFor(runtime.GOMAXPROCS(0)))
	if cfg.Shards <= 0 {
		cfg.Shards = runtime.GOMAXPROCS(0)
	}
	c.nLoop = max(cfg.LoopShards, 0)
	c.ring, err = udpshard.New(udpshard.Config{
		Bind: cfg.Bind, Shards: c.nLoop + cfg.Shards, Owned: c.nLoop, QueueLen: cfg.QueueLen, Handler: c.onDatagram,
		OnSendError: c.onSendError, Logger: lg, ReadGate: testReadGate,
	})
	if err != nil {
		return nil, fmt.Errorf("rlclient: %w", err)
	}
	for i := 0; i < c.ring.Shards(); i++ {
		es := &shardEngine{c: c, idx: i, wake: make(chan struct{}, 1), heap: make([]timerEntry, 0, 64), fifo: make([]timerEntry, 0, 1024)}
		c.shards = append(c.shards, es)
	}
	for i := range c.nLoop {
		c.loops = append(c.loops, newLoopShard(c, i))
	}
	for _, es := range c.shards {
		c.wg.Add(1)
		go es.timerLoop()
	}
	c.disc = newDiscovery(cfg.SRV, cfg.Bind, res, clk, lg)
	c.disc.start()
	c.wg.Add(1)
	go c.proberLoop()
	return c, nil
}

// testRequestID, when set by a test (before New), gives every check its
// request id (the conformance vectors use fixed ids). Nil in production.
var testRequestID func() uint64

// testReadGate is handed to udpshard as Config.ReadGate: tests set it
// (before New) to hold the socket readers back. Nil in production.
var testReadGate func(*udpshard.Socket)

// Ready reports whether discovery has succeeded at least once.
func (c *Client) Ready() bool { return c.disc.ready.Load() }

// Endpoints returns the current membership (nil when none).
func (c *Client) Endpoints() []Endpoint {
	m := c.disc.current()
	if m == nil {
		return nil
	}
	out := make([]Endpoint, len(m.eps))
	for i, e := range m.eps {
		out[i] = e.Endpoint
	}
	return out
}

// DiscoveryError is the error of the latest failed lookup (nil after a
// success).
func (c *Client) DiscoveryError() error { return c.disc.err() }

// Horizon is the request horizon of the configured policy.
func (c *Client) Horizon() time.Duration { return c.horizon }

// Stats returns a snapshot of the counters.
func (c *Client) Stats() Stats {
	st := Stats{
		Ready: c.Ready(), Lookups: c.disc.lookups.Load(), LookupFailures: c.disc.failures.Load(),
		LKGExpired: c.disc.expired.Load(),
		Checks:     c.c.checks.Load(), InFlight: c.c.inflight.Load(), Replays: c.c.replays.Load(),
		Completions: c.c.completions.Load(), Reports: c.c.reports.Load(), ReportsDropped: c.c.reportsDropped.Load(),
		Steers: c.c.steers.Load(), Probes: c.c.probes.Load(), ProbeAnswers: c.c.probeAnswers.Load(),
		DecidedEarly: c.c.decidedEarly.Load(), DecidedAtUnit: c.c.decidedAtUnit.Load(), FailureWarns: c.c.warns.Load(),
		LoopDone: c.c.loopDone.Load(), LoopHandoffs: c.c.loopHandoffs.Load(),
		Drops: RecvDrops{
			Malformed: c.c.malformed.Load(), Kind: c.c.kind.Load(), UnknownID: c.c.unknownID.Load(),
			Auth: c.c.auth.Load(), Stale: c.c.stale.Load(), Body: c.c.body.Load(), Echo: c.c.echo.Load(),
			UnknownSource: c.c.unknownSrc.Load(), Duplicate: c.c.dup.Load(),
		},
		Ring: c.ring.Stats(),
	}
	if m := c.disc.current(); m != nil {
		st.Endpoints = len(m.eps)
		st.Usable = c.usableCount(m)
		now := c.clock.Now().UnixNano()
		for _, e := range m.eps {
			st.PerEndpoint = append(st.PerEndpoint, EndpointStats{Endpoint: e.Endpoint,
				Usable: e.health.usable(now, c.horizon), Epoch: e.epoch.Load(), Chosen: e.chosen.Load()})
		}
	}
	for i := range st.Causes {
		st.Causes[i] = c.c.causes[i].Load()
	}
	return st
}

// Close stops discovery, the timer goroutines and the UDP shards. Checks in
// flight end with CauseCancelled. Idempotent.
func (c *Client) Close() error {
	c.once.Do(func() {
		c.closed.Store(true)
		c.disc.stop()
		c.table.failAll(c)
		close(c.done)
		c.wg.Wait()
		c.ring.Close()
		c.pool.stop()
	})
	return nil
}
