package rlclient

import (
	"context"
	"crypto/rand"
	"math/bits"
	randv2 "math/rand/v2"
	"sync"
	"time"

	"github.com/rl-tproxy/rl-tproxy/pkg/ratelimitly/wire"
	"github.com/rl-tproxy/rl-tproxy/pkg/udpshard"
)

// request is the pooled state of one check.
type request struct {
	mu    sync.Mutex
	gen   uint64
	hidx  int // index in es.heap, -1 = no pending deadline (guarded by es.mu)
	fpos  uint64
	id    uint64
	state uint8
	c     *Client
	es    *shardEngine
	sock  *udpshard.Socket
	mem   *membership
	ls    *loopShard // the loop that started the check (CheckAsyncLoop), or nil
	// onLoop: the check's deadlines are on its loop (loopdl.go); lseq
	// names the current one there (bumped by every schedule and
	// unschedule, never reset). Both under r.mu.
	onLoop bool
	lseq   uint64

	start      time.Time
	round      int // 0 initial, 1..Replays replay rounds, Replays+1 final receive
	attempt    uint8
	full       uint64 // endpoints sent to: the usable set when the check started
	answered   uint64 // answered the latest send (valid or not); reset to valid on a replay
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

	// out and comp are where the outcome goes (CheckAsync); fire says
	// that the request ended while r.mu was held and r.unlock must
	// deliver the outcome.
	out  *Decision
	comp Completer
	fire bool
}

const (
	statePending uint8 = iota
	stateDone
)

// Check runs one rate check and fills out. It returns nil for a valid
// decision (out.Cause.Decided(): CauseAllow or a CauseDeny* value) and the cause's error
// otherwise. req is only read during the call. Cancelling ctx retires the
// request at once (CauseCancelled) with nothing left behind. It is
// CheckAsync and a wait for its completion.
func (c *Client) Check(ctx context.Context, req *wire.RateRequest, out *Decision) error {
	if ctx.Err() != nil {
		out.Reset()
		c.c.checks.Add(1)
		return c.finishEarly(out, CauseCancelled, nil)
	}
	w := waiters.get()
	p, decided, err := c.CheckAsync(req, out, w)
	if !decided {
		if cancel := ctx.Done(); cancel == nil { // cannot be cancelled: a plain receive is cheaper than select
			<-w.ch
		} else {
			select {
			case <-w.ch:
			case <-cancel:
				c.Abort(p) // completes it, unless it was decided concurrently: that decision stands
				<-w.ch
			}
		}
		err = w.err
	}
	waiters.put(w)
	return err
}

// start readies r for req and sends its first round; r.mu is held. It
// returns false (r back in the pool, out filled by finishEarly) when the
// request cannot be built.
func (c *Client) start(r *request, ls *loopShard, mem *membership, req *wire.RateRequest, out *Decision) bool {
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
		c.finishEarly(out, CauseConstruction, err)
		return false
	}
	r.plen = len(body)
	c.c.inflight.Add(1)
	var shard int
	if ls != nil {
		shard = ls.idx // the loop's own shard
	} else {
		shard = c.goShard()
	}
	r.ls = ls
	r.onLoop = ls != nil
	r.es = c.shards[shard]
	r.sock = c.ring.Hold(shard)
	r.mem = mem
	r.id = randv2.Uint64() &^ tokenMask
	if testRequestID != nil {
		r.id = testRequestID()
	}
	r.start = c.startOn(ls)
	r.round, r.attempt = 0, 0
	r.full = c.usableMask(mem, r.start.UnixNano())
	r.answered, r.valid, r.sendFailed = 0, 0, 0
	r.best, r.bestEpoch, r.bestCause, r.sawCard, r.sawProto = -1, 0, CauseTimeout, false, false
	r.nGuards, r.nResources = len(req.Guards), len(req.Resources)
	r.cause = CauseTimeout // overwritten when the request ends (r.state says whether it has)
	r.pushed = false
	r.state = statePending
	c.table.put(r)
	if c.closed.Load() { // Close ran between the caller's check and put
		r.finishLocked(CauseCancelled)
		return true
	}
	sent := r.sendRound(r.start)
	if sent == 0 {
		r.finishLocked(CauseSendFailure)
	} else if r.state == statePending {
		r.schedule(r.start.Add(c.policy.Unit))
	}
	return true
}

// goShard picks the next goroutine shard (round robin): the loops'
// shards carry only their own loop's checks.
func (c *Client) goShard() int { return c.nLoop + int(c.next.Add(1))%(len(c.shards)-c.nLoop) }

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
	c.noteFailure(cause)
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
		ep := r.mem.eps[r.best]
		out.Endpoint = ep.Target
		ep.chosen.Add(1)
		out.Guards = append(out.Guards[:0], r.guards[:r.nGuards]...)
		out.Resources = append(out.Resources[:0], r.resources[:r.nResources]...)
	}
	c.c.causes[r.cause].Add(1)
	c.noteFailure(r.cause)
	c.c.inflight.Add(-1)
	r.sock.Release()
	c.pool.put(r)
	return causeErr[out.Cause]
}

// tokenMask is the low bits of a request id kept zero so that a send token
// can carry the endpoint index (MaxEndpoints <= 64).
const tokenMask = 63

// sendRound seals the request for the current attempt and queues it to
// every endpoint of r.full that has not answered this attempt (on a
// replay: that has no valid answer). r.mu is held, so it only pushes: the
// caller flushes the shard after unlocking. It returns the number of
// datagrams queued. now is the client clock's time (the wire timestamp).
func (r *request) sendRound(now time.Time) int {
	c := r.c
	h := &r.hdr
	*h = wire.Header{Kind: wire.KindRateRequest, Attempt: r.attempt, TTLms: c.ttlMs, RequestID: r.id,
		Timestamp: uint64(now.UnixMilli())}
	if r.attempt > 0 {
		h.Flags = wire.FlagReplay
	}
	sent := 0
	for todo := r.full &^ r.answered; todo != 0; {
		i := bits.TrailingZeros64(todo)
		bit := uint64(1) << uint(i)
		todo &^= bit
		ep := r.mem.eps[i]
		if r.attempt == 0 {
			ep.health.sent(now.UnixNano())
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

// finishLocked ends the request with cause. r.mu is held; the caller
// releases it with r.unlock, which delivers the outcome.
func (r *request) finishLocked(cause Cause) {
	if r.state != statePending {
		return
	}
	r.state = stateDone
	r.cause = cause
	r.c.table.remove(r.id)
	r.unschedule()
	if cause.Decided() && r.c.policy.Completion {
		r.sendCompletions()
	}
	r.fire = true // r.unlock delivers the outcome
}

func (r *request) sendCompletions() {
	c := r.c
	missing := r.full &^ r.valid
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
