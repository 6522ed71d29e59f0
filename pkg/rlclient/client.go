// Package rlclient is the RateLimitly client: it discovers the servers of a
// deployment by DNS SRV, sends each rate check to every endpoint through
// per-CPU UDP rings (pkg/udpshard), follows a request policy (fan-out,
// replay, final receive, completion delivery) and returns exactly one
// decision or failure cause per check; it also sends latency reports.
//
// # Discovery
//
// The SRV name is looked up through the configured resolver (or
// /etc/resolv.conf), then A/AAAA of each target unless the answer carries
// glue. Every SRV target is one endpoint (server identity = target name)
// with its SRV port; the first usable IPv4 address is used, else the first
// IPv6 one (only families the bind address can reach are considered).
// Membership is strict: a failed lookup, an empty answer, a "." target,
// port 0, a target without a usable address, duplicate targets or shared
// addresses are errors; there is never a fallback address. Lookups run in
// one background goroutine: refresh after the smallest record TTL clamped
// to [MinRefresh, MaxRefresh] (5 s .. 5 min); a failed lookup is retried
// after 0.5 s doubling to 5 s; the last-known-good membership is used for
// up to LastKnownGood (10 min) after it was fetched, then dropped.
//
// # Request engine
//
// Check sends the request to every endpoint at once. It decides early when
// the oldest known endpoint (smallest server_epoch seen so far) gives a
// valid answer, or when every endpoint has answered. At the end of each
// round it decides with the valid answer of the smallest server_epoch if
// there is one, else replays (same request id, attempt+1, replay bit) to
// the endpoints that have not answered, and after the last replay round
// receives only for FinalReceive, deciding on the first valid answer. At
// the horizon it fails with the most specific cause seen (cardinality >
// protocol/authentication > send failure > timeout). After a decision a
// COMPLETION (decision + original request) goes to every endpoint that did
// not answer, when the policy enables completion delivery.
//
// A check's datagrams are queued on its shard; under load the shard's
// loop sends the datagrams of many checks together (udpshard FlushAsync:
// one sendmmsg, one UDP_SEGMENT message per endpoint), with about one
// check per shard in flight the check sends them itself.
//
// Request state is pooled and time is kept by one timer goroutine per
// shard with a min-heap of deadlines: no goroutine or timer per request,
// and zero allocations per Check in steady state. Before it acts on a due
// deadline the timer goroutine reads the answers already queued on its
// shard's sockets (udpshard Drain), so that answers that arrived while the
// readers could not run (a stalled or overloaded process) still decide
// instead of being replayed or timed out. A response may arrive on
// any shard's socket: it is matched by request id through a shared table,
// then authenticated, and matched to an endpoint by source address.
// Steering feedback (steering_feedback = 0 in an authenticated answer)
// asks the sending shard for a safe source-port rebind (udpshard).
package rlclient

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"math/bits"
	randv2 "math/rand/v2"
	"net/netip"
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

	Shards   int   // UDP/timer shards; 0 = GOMAXPROCS
	QueueLen int   // per-shard send queue; 0 = udpshard default
	Clock    Clock // nil = wall clock
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
	Drops          RecvDrops
	Ring           udpshard.Stats
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
	inflight                                                             atomic.Int64
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
	table   reqTable
	pool    reqPool
	next    atomic.Uint32
	c       counters
	closed  atomic.Bool
	once    sync.Once
	done    chan struct{}
	wg      sync.WaitGroup
}

// New validates cfg, opens the UDP rings and starts discovery in the
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
	c.table.init()
	c.ring, err = udpshard.New(udpshard.Config{
		Bind: cfg.Bind, Shards: cfg.Shards, QueueLen: cfg.QueueLen, Handler: c.onDatagram,
		OnSendError: c.onSendError, Logger: lg, ReadGate: testReadGate,
	})
	if err != nil {
		return nil, fmt.Errorf("rlclient: %w", err)
	}
	for i := 0; i < c.ring.Shards(); i++ {
		es := &shardEngine{c: c, idx: i, wake: make(chan struct{}, 1), heap: make([]timerEntry, 0, 256)}
		c.shards = append(c.shards, es)
	}
	for _, es := range c.shards {
		c.wg.Add(1)
		go es.timerLoop()
	}
	c.disc = newDiscovery(cfg.SRV, cfg.Bind, res, clk, lg)
	c.disc.start()
	return c, nil
}

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
		Steers: c.c.steers.Load(),
		Drops: RecvDrops{
			Malformed: c.c.malformed.Load(), Kind: c.c.kind.Load(), UnknownID: c.c.unknownID.Load(),
			Auth: c.c.auth.Load(), Stale: c.c.stale.Load(), Body: c.c.body.Load(), Echo: c.c.echo.Load(),
			UnknownSource: c.c.unknownSrc.Load(), Duplicate: c.c.dup.Load(),
		},
		Ring: c.ring.Stats(),
	}
	if m := c.disc.current(); m != nil {
		st.Endpoints = len(m.eps)
	}
	for i := range st.Causes {
		st.Causes[i] = c.c.causes[i].Load()
	}
	return st
}

// Close stops discovery, the timer goroutines and the rings. Checks in
// flight end with CauseCancelled. Idempotent.
func (c *Client) Close() error {
	c.once.Do(func() {
		c.closed.Store(true)
		c.disc.stop()
		c.table.failAll(c)
		close(c.done)
		c.wg.Wait()
		c.ring.Close()
	})
	return nil
}

// request is the pooled state of one check.
type request struct {
	mu    sync.Mutex
	gen   uint64
	hidx  int // index in es.heap, -1 = no pending deadline (guarded by es.mu)
	id    uint64
	state uint8
	c     *Client
	es    *shardEngine
	sock  *udpshard.Socket
	mem   *membership

	start      time.Time
	round      int // 0 initial, 1..Replays replay rounds, Replays+1 final receive
	attempt    uint8
	full       uint64 // bitmask of all endpoints
	answered   uint64 // authenticated answer received (valid or not)
	valid      uint64 // valid answers
	sendFailed uint64
	best       int
	bestEpoch  uint64
	bestCause  Cause // ratelimitly.Classify of the best answer
	sawCard    bool
	sawProto   bool

	nGuards, nResources int
	guards              [wire.MaxCount]wire.GuardResult
	resources           [wire.MaxCount]wire.ResourceResult

	cause Cause
	plain [1 + wire.MaxBody]byte // [decision][RATE_REQUEST body]
	plen  int                    // bytes of plain in use (incl. the decision byte)
	// pushed: completions were queued under r.mu and the shard still
	// needs a flush (onDatagram flushes only then).
	pushed bool
	pkt    [wire.MaxDatagram]byte
	hdr    wire.Header
	done   chan struct{}
}

const (
	statePending uint8 = iota
	stateDone
	stateCancelled
)

// Check runs one rate check and fills out. It returns nil for a valid
// decision (out.Cause.Decided(): CauseAllow or a CauseDeny* value) and the cause's error
// otherwise. req is only read during the call. Cancelling ctx retires the
// request at once (CauseCancelled) with nothing left behind.
func (c *Client) Check(ctx context.Context, req *wire.RateRequest, out *Decision) error {
	out.Reset()
	c.c.checks.Add(1)
	if ctx.Err() != nil {
		return c.finishEarly(out, CauseCancelled, nil)
	}
	if c.closed.Load() {
		return c.finishEarly(out, CauseNoEndpoints, ErrClosed)
	}
	mem := c.disc.current()
	if mem == nil || len(mem.eps) == 0 {
		return c.finishEarly(out, CauseNoEndpoints, nil)
	}
	r := c.pool.get(c)
	r.mu.Lock() // stale readers from r's previous life may still look at it
	body, err := req.AppendBody(r.plain[:1])
	if err == nil && c.policy.Completion && len(body) > wire.MaxBody {
		err = wire.ErrTooLarge // the completion (decision + request) must fit too
	}
	if err == nil && wire.HeaderLen+len(body)-1+wire.TagLen > wire.MaxDatagram {
		err = wire.ErrTooLarge
	}
	if err != nil {
		r.mu.Unlock()
		c.pool.put(r)
		return c.finishEarly(out, CauseConstruction, err)
	}
	r.plen = len(body)
	c.c.inflight.Add(1)
	shard := int(c.next.Add(1)) % len(c.shards)
	r.es = c.shards[shard]
	r.sock = c.ring.Hold(shard)
	r.mem = mem
	r.id = randv2.Uint64() &^ tokenMask
	r.start = c.clock.Now()
	r.round, r.attempt = 0, 0
	r.full = 1<<uint(len(mem.eps)) - 1
	r.answered, r.valid, r.sendFailed = 0, 0, 0
	r.best, r.bestEpoch, r.bestCause, r.sawCard, r.sawProto = -1, 0, CauseTimeout, false, false
	r.nGuards, r.nResources = len(req.Guards), len(req.Resources)
	r.cause = CauseTimeout // overwritten when the request ends (r.state says whether it has)
	r.pushed = false
	r.state = statePending
	c.table.put(r)
	if c.closed.Load() { // Close ran between the check above and put
		r.finishLocked(CauseCancelled)
		r.mu.Unlock()
		<-r.done
		return c.finish(r, out)
	}
	sent := r.sendRound()
	if sent == 0 {
		r.finishLocked(CauseSendFailure)
	} else if r.state == statePending {
		r.es.schedule(r, r.start.Add(c.policy.Unit))
	}
	r.mu.Unlock()
	c.flush(shard) // after unlocking: datagrams were only queued under r.mu

	cancel := ctx.Done()
	if cancel == nil { // cannot be cancelled: a plain receive is cheaper than select
		<-r.done
		return c.finish(r, out)
	}
	select {
	case <-r.done:
	case <-cancel:
		r.mu.Lock()
		if r.state == statePending {
			r.state = stateCancelled
			r.cause = CauseCancelled
			c.table.remove(r.id)
			r.es.unschedule(r)
			r.mu.Unlock()
		} else {
			r.mu.Unlock()
			<-r.done // decided concurrently: the decision stands
		}
	}
	return c.finish(r, out)
}

// flush sends what this goroutine queued on shard. Under load the shard
// loop sends it together with the datagrams of the other checks that
// become runnable meanwhile (one sendmmsg, and one UDP_SEGMENT message per
// endpoint, for many checks). With about one check per shard in flight
// there is nothing to wait for: sending at once saves the hand-off to the
// loop and its wake-up.
func (c *Client) flush(shard int) {
	if c.c.inflight.Load() <= int64(len(c.shards)) {
		c.ring.Flush(shard)
	} else {
		c.ring.FlushAsync(shard)
	}
}

func (c *Client) finishEarly(out *Decision, cause Cause, err error) error {
	out.Cause = cause
	out.Err = err
	c.c.causes[cause].Add(1)
	if err == ErrClosed {
		return err
	}
	return causeErr[cause]
}

// finish copies the outcome into out, releases the socket hold and returns
// r to the pool.
func (c *Client) finish(r *request, out *Decision) error {
	out.Cause = r.cause
	out.Attempts = int(r.attempt) + 1
	if r.cause.Decided() {
		out.Allow = r.cause == CauseAllow
		out.ServerEpoch = r.bestEpoch
		out.Endpoint = r.mem.eps[r.best].Target
		out.Guards = append(out.Guards[:0], r.guards[:r.nGuards]...)
		out.Resources = append(out.Resources[:0], r.resources[:r.nResources]...)
	}
	c.c.causes[r.cause].Add(1)
	c.c.inflight.Add(-1)
	r.sock.Release()
	c.pool.put(r)
	return causeErr[out.Cause]
}

// tokenMask is the low bits of a request id kept zero so that a send token
// can carry the endpoint index (MaxEndpoints <= 64).
const tokenMask = 63

// sendRound seals the request for the current attempt and queues it to
// every endpoint that has not answered. r.mu is held, so it only pushes:
// the caller flushes the shard after unlocking. It returns the number of
// datagrams queued.
func (r *request) sendRound() int {
	c := r.c
	h := &r.hdr
	*h = wire.Header{Kind: wire.KindRateRequest, Attempt: r.attempt, TTLms: c.ttlMs, RequestID: r.id,
		Timestamp: uint64(c.clock.Now().UnixMilli())}
	if r.attempt > 0 {
		h.Flags = wire.FlagReplay
	}
	sent := 0
	for i, ep := range r.mem.eps {
		bit := uint64(1) << uint(i)
		if r.answered&bit != 0 {
			continue
		}
		if _, err := rand.Read(h.Nonce[:]); err != nil {
			r.sendFailed |= bit
			continue
		}
		pkt, err := c.key.SealBody(r.pkt[:0], h, r.plain[1:r.plen])
		if err != nil {
			r.sendFailed |= bit
			continue
		}
		if err := c.ring.Push(r.sock, ep.Addr, pkt, r.id|uint64(i)); err != nil {
			r.sendFailed |= bit
			continue
		}
		r.sendFailed &^= bit
		sent++
	}
	if r.attempt > 0 {
		c.c.replays.Add(uint64(sent))
	}
	return sent
}

// finishLocked ends the request with cause. r.mu is held.
func (r *request) finishLocked(cause Cause) {
	if r.state != statePending {
		return
	}
	r.state = stateDone
	r.cause = cause
	r.c.table.remove(r.id)
	r.es.unschedule(r)
	if cause.Decided() && r.c.policy.Completion {
		r.sendCompletions()
	}
	r.done <- struct{}{}
}

func (r *request) sendCompletions() {
	c := r.c
	missing := r.full &^ r.answered
	if missing == 0 {
		return
	}
	if r.cause == CauseAllow {
		r.plain[0] = wire.DecisionAllow
	} else {
		r.plain[0] = wire.DecisionDeny
	}
	h := &r.hdr
	*h = wire.Header{Kind: wire.KindCompletion, Attempt: r.attempt, TTLms: c.ttlMs, RequestID: r.id,
		Timestamp: uint64(c.clock.Now().UnixMilli())}
	for missing != 0 {
		i := bits.TrailingZeros64(missing)
		missing &^= 1 << uint(i)
		if _, err := rand.Read(h.Nonce[:]); err != nil {
			continue
		}
		pkt, err := c.key.SealBody(r.pkt[:0], h, r.plain[:r.plen])
		if err != nil {
			continue
		}
		if c.ring.Push(r.sock, r.mem.eps[i].Addr, pkt, 0) == nil {
			c.c.completions.Add(1)
			r.pushed = true
		}
	}
}

// onTimer runs at the end of a round.
func (r *request) onTimer(gen uint64) {
	r.mu.Lock()
	if r.gen != gen || r.state != statePending {
		r.mu.Unlock()
		return
	}
	shard := r.sock.Shard()
	r.roundEndLocked()
	r.pushed = false // flushed below, whatever the round queued
	r.mu.Unlock()
	r.c.flush(shard)
}

// roundEndLocked applies the end-of-round rules (r.mu held).
func (r *request) roundEndLocked() {
	p := &r.c.policy
	if r.valid != 0 {
		r.decideLocked()
		return
	}
	switch {
	case r.round < p.Replays:
		deadline := r.roundEnd()
		r.round++
		r.attempt++
		r.sendRound()
		r.es.schedule(r, deadline.Add(p.Gap(r.round-1)))
	case r.round == p.Replays && p.FinalReceive > 0:
		deadline := r.roundEnd()
		r.round++
		r.es.schedule(r, deadline.Add(p.FinalReceive))
	default:
		r.finishLocked(r.failCause())
	}
}

// roundEnd is the scheduled end of the current round.
func (r *request) roundEnd() time.Time {
	p := &r.c.policy
	t := r.start.Add(p.Unit)
	for i := 0; i < r.round && i < p.Replays; i++ {
		t = t.Add(p.Gap(i))
	}
	return t
}

func (r *request) failCause() Cause {
	switch {
	case r.sawCard:
		return CauseCardinality
	case r.sawProto:
		return CauseProtocol
	case r.answered == 0 && r.sendFailed == r.full:
		return CauseSendFailure
	}
	return CauseTimeout
}

func (r *request) decideLocked() {
	r.finishLocked(r.bestCause)
}

// afterAnswer applies the early-decision rules. r.mu is held.
func (r *request) afterAnswer(i int) {
	if r.state != statePending {
		return
	}
	if r.answered == r.full {
		if r.valid != 0 {
			r.decideLocked()
		} else {
			r.finishLocked(r.failCause())
		}
		return
	}
	if r.valid&(1<<uint(i)) == 0 {
		return
	}
	if r.round > r.c.policy.Replays { // final receive: first valid answer decides
		r.decideLocked()
		return
	}
	// The oldest known endpoint answered: no other endpoint has a known
	// smaller epoch.
	e := r.mem.eps[i].epoch.Load()
	for j, ep := range r.mem.eps {
		if j == i {
			continue
		}
		if o := ep.epoch.Load(); o != 0 && o < e {
			return
		}
	}
	r.decideLocked()
}

// onSendError marks an endpoint whose datagram the kernel refused.
func (c *Client) onSendError(token uint64, _ error) {
	r := c.table.get(token &^ tokenMask)
	if r == nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.id != token&^tokenMask || r.state != statePending {
		return
	}
	i := int(token & tokenMask)
	if i >= len(r.mem.eps) {
		return
	}
	r.sendFailed |= 1 << uint(i)
	if r.answered == 0 && r.sendFailed == r.full {
		r.finishLocked(CauseSendFailure)
	}
}

// shardEngine is the engine side of a shard: deadlines and receive scratch.
type shardEngine struct {
	c     *Client
	idx   int
	mu    sync.Mutex
	heap  []timerEntry
	armed time.Time // deadline the timer goroutine sleeps for (zero = none)
	wake  chan struct{}

	rxMu sync.Mutex
	hdr  wire.Header
	resp wire.RateResponse
	rep  wire.LatencyReport
	txMu sync.Mutex
	rhdr wire.Header
	rpkt [wire.MaxDatagram]byte
}

// onDatagram handles every datagram received by any shard socket.
func (c *Client) onDatagram(rx *udpshard.Socket, pkt []byte, from netip.AddrPort) {
	es := c.shards[rx.Shard()]
	es.rxMu.Lock()
	defer es.rxMu.Unlock()
	h := &es.hdr
	if err := h.Decode(pkt); err != nil {
		c.c.malformed.Add(1)
		return
	}
	if h.Kind != wire.KindRateResponse {
		c.c.kind.Add(1)
		return
	}
	id := h.RequestID
	r := c.table.get(id)
	pt, err := c.key.Open(pkt, h)
	if err != nil {
		c.c.auth.Add(1)
		if r != nil {
			r.mu.Lock()
			if r.id == id && r.state == statePending {
				r.sawProto = true
			}
			r.mu.Unlock()
		}
		return
	}
	if wire.CheckTime(h, c.clock.Now(), wire.DefaultSkew) != nil {
		c.c.stale.Add(1)
		return
	}
	resp := &es.resp
	bodyErr := resp.DecodeBody(pt)
	if r == nil {
		c.lateAnswer(rx, h, bodyErr, resp, from)
		return
	}
	steer := false
	r.mu.Lock()
	if r.id != id || r.state != statePending {
		r.mu.Unlock()
		c.lateAnswer(rx, h, bodyErr, resp, from)
		return
	}
	i := r.mem.indexOf(from)
	switch {
	case i < 0:
		c.c.unknownSrc.Add(1)
	case h.Attempt > r.attempt || h.TTLms != c.ttlMs || h.Replay() != (h.Attempt > 0):
		c.c.echo.Add(1)
		r.sawProto = true
	case r.answered&(1<<uint(i)) != 0:
		c.c.dup.Add(1)
	default:
		steer = !h.Steering()
		r.answered |= 1 << uint(i)
		switch {
		case bodyErr != nil:
			c.c.body.Add(1)
			r.sawProto = true
		case resp.Status != wire.StatusOK:
			r.sawProto = true
		case len(resp.Guards) != r.nGuards || len(resp.Resources) != r.nResources:
			r.sawCard = true
		default:
			r.acceptLocked(i, resp)
		}
		r.afterAnswer(i)
	}
	pushed := r.pushed
	r.pushed = false
	shard := r.sock.Shard()
	r.mu.Unlock()
	if pushed {
		c.flush(shard) // completions queued by a decision
	}
	if steer {
		c.c.steers.Add(1)
		c.ring.Rebind(rx) // the socket the server saw; ignored unless current
	}
}

// lateAnswer handles an authenticated answer that arrived after its
// request was retired: it still carries steering feedback, and its epoch
// is learned so that "oldest known endpoint" converges even when early
// decisions cut requests short.
func (c *Client) lateAnswer(rx *udpshard.Socket, h *wire.Header, bodyErr error, resp *wire.RateResponse, from netip.AddrPort) {
	c.c.unknownID.Add(1)
	if !h.Steering() {
		c.c.steers.Add(1)
		c.ring.Rebind(rx)
	}
	if bodyErr != nil || resp.Status != wire.StatusOK {
		return
	}
	if m := c.disc.current(); m != nil {
		if i := m.indexOf(from); i >= 0 {
			m.eps[i].epoch.Store(resp.ServerEpoch)
		}
	}
}

// acceptLocked records a valid answer and keeps it if it is the oldest.
func (r *request) acceptLocked(i int, resp *wire.RateResponse) {
	e := resp.ServerEpoch
	r.mem.eps[i].epoch.Store(e)
	r.valid |= 1 << uint(i)
	if r.best >= 0 && r.bestEpoch <= e {
		return
	}
	r.best, r.bestEpoch = i, e
	copy(r.guards[:], resp.Guards)
	copy(r.resources[:], resp.Resources)
	r.bestCause = ratelimitly.Classify(resp, int(r.nGuards), int(r.nResources))
}

// Report sends one latency report for service to every endpoint, fire and
// forget: it never blocks on the network and a failure only counts.
// Duration is sent in milliseconds clamped to 1..4294967295.
func (c *Client) Report(service []byte, d time.Duration) {
	m := c.disc.current()
	if c.closed.Load() || m == nil || len(service) == 0 || len(service) > wire.MaxName {
		c.c.reportsDropped.Add(1)
		return
	}
	ms := d.Milliseconds()
	if ms < 1 {
		ms = 1
	} else if ms > 1<<32-1 {
		ms = 1<<32 - 1
	}
	shard := int(c.next.Add(1)) % len(c.shards)
	es := c.shards[shard]
	es.txMu.Lock()
	defer es.txMu.Unlock()
	es.rep.Entries = append(es.rep.Entries[:0], wire.ReportEntry{Service: service, DurationMs: uint32(ms)})
	h := &es.rhdr
	*h = wire.Header{TTLms: c.ttlMs, RequestID: randv2.Uint64() &^ tokenMask, Timestamp: uint64(c.clock.Now().UnixMilli())}
	pkt, err := c.key.Seal(es.rpkt[:0], h, &es.rep)
	es.rep.Entries[0].Service = nil
	if err != nil {
		c.c.reportsDropped.Add(1)
		return
	}
	for _, ep := range m.eps {
		if c.ring.PushCurrent(shard, ep.Addr, pkt, 0) != nil {
			c.c.reportsDropped.Add(1)
			continue
		}
		c.c.reports.Add(1)
	}
	c.ring.FlushAsync(shard)
}
