package rlserver

import (
	"errors"
	"math"
	"math/bits"
	"net"
	"os"
	"sync/atomic"
	"time"

	"github.com/rl-tproxy/rl-tproxy/pkg/ratelimitly/wire"
)

type counter int

const (
	cReceived counter = iota
	cReadBatches
	cCoalesced
	cReadErrors
	cRequests
	cAllows
	cDenies
	cMalformed
	cReplays
	cReports
	cReportEntries
	cCompletions
	cCompletionsApplied
	cCompletionsIgnored
	cResponses
	cSendErrors
	cSteered
	numCounters
)

type drop int

const (
	dropTooLarge drop = iota
	dropTruncated
	dropMagic
	dropVersion
	dropKind
	dropUnknownKey
	dropAuth
	dropStale
	dropHorizon
	dropMalformed
	dropReplayedReport
	dropHook
	dropInternal
	numDrops
)

var dropNames = [numDrops]string{
	dropTooLarge:       "too_large",
	dropTruncated:      "truncated",
	dropMagic:          "magic",
	dropVersion:        "version",
	dropKind:           "kind",
	dropUnknownKey:     "unknown_key",
	dropAuth:           "auth",
	dropStale:          "stale",
	dropHorizon:        "horizon",
	dropMalformed:      "malformed",
	dropReplayedReport: "replayed_report",
	dropHook:           "hook",
	dropInternal:       "internal",
}

// decision modes: a RATE_REQUEST, or a COMPLETION applying a decision.
type mode int

const (
	modeRequest mode = iota
	modeForceAllow
	modeForceDeny
)

// worker owns one socket and all scratch space for its datagrams.
type worker struct {
	s          *Server
	id         int
	bc         *batchConn
	batch      int
	fullTurns  int
	overloaded bool

	c [numCounters]atomic.Uint64
	d [numDrops]atomic.Uint64

	h    wire.Header
	rh   wire.Header
	req  wire.RateRequest
	rep  wire.LatencyReport
	comp wire.Completion
	resp wire.RateResponse
	key  []byte
	body []byte // an encoded RATE_RESPONSE body, before the dedup slot copies it

	rb    [wire.MaxCount]*bucket
	orig  [wire.MaxCount]float64
	seen  [wire.MaxCount]float64
	shard [wire.MaxCount]uint8
}

// keyCap is the initial capacity of a worker's key buffer (the tenant
// prefix, u16 length and name, then a bucket or service name): a name at
// wire.MaxName after a tenant of up to 64 bytes never grows it.
const keyCap = 2 + 64 + wire.MaxName

func newWorker(s *Server, id int, bc *batchConn) *worker {
	w := &worker{s: s, id: id, bc: bc, batch: s.cfg.Batch, key: make([]byte, 0, keyCap),
		body: make([]byte, 0, wire.MaxBody)}
	w.req.Guards = make([]wire.Guard, 0, wire.MaxCount)
	w.req.Resources = make([]wire.Resource, 0, wire.MaxCount)
	w.comp.Request.Guards = make([]wire.Guard, 0, wire.MaxCount)
	w.comp.Request.Resources = make([]wire.Resource, 0, wire.MaxCount)
	w.rep.Entries = make([]wire.ReportEntry, 0, wire.MaxCount)
	w.resp.Guards = make([]wire.GuardResult, 0, wire.MaxCount)
	w.resp.Resources = make([]wire.ResourceResult, 0, wire.MaxCount)
	return w
}

func (w *worker) inc(c counter)  { w.c[c].Add(1) }
func (w *worker) dropped(r drop) { w.d[r].Add(1) }

func (w *worker) run() {
	defer w.s.wg.Done()
	for {
		n, err := w.bc.recv(w.batch)
		if err != nil {
			if w.s.closing.Load() || errors.Is(err, net.ErrClosed) {
				w.drain()
				return
			}
			if errors.Is(err, os.ErrDeadlineExceeded) {
				continue
			}
			w.inc(cReadErrors)
			continue
		}
		w.noteTurn(w.datagrams(n))
		w.turn(n)
	}
}

// datagrams counts the datagrams in the n messages of a read turn (a
// message coalesced by UDP_GRO holds several).
func (w *worker) datagrams(n int) int {
	d := 0
	for i := 0; i < n; i++ {
		msg, seg, _ := w.bc.message(i)
		if seg > 0 && seg < len(msg) {
			d += (len(msg) + seg - 1) / seg
		} else {
			d++
		}
	}
	return d
}

// noteTurn applies the overload rule (docs/protocol.md §6.7) after a read
// turn that brought d datagrams: a turn with k full batches' worth
// (datagrams coalesced by UDP_GRO) counts as k full turns, so a batching
// client's backlog reports overload as one sent datagram by datagram does.
func (w *worker) noteTurn(d int) {
	if w.batch <= 1 {
		return
	}
	if d >= w.batch {
		w.fullTurns += d / w.batch
	} else {
		w.fullTurns = 0
	}
	w.overloaded = w.fullTurns >= OverloadTurns
}

// drain answers datagrams already queued when the server closes.
func (w *worker) drain() {
	for i := 0; i < drainTurns; i++ {
		n, err := w.bc.recvNow(w.batch)
		if err != nil || n == 0 {
			return
		}
		w.turn(n)
	}
}

// turn handles the n messages of one read turn (each one datagram, or
// several coalesced by UDP_GRO) and sends the answers in one batch (one
// per MaxBatch answers).
func (w *worker) turn(n int) {
	if n == 0 {
		return
	}
	w.inc(cReadBatches)
	now := w.s.now() // one clock read per turn (handleAt)
	k := 0
	for i := 0; i < n; i++ {
		msg, seg, trunc := w.bc.message(i)
		if seg > 0 && seg < len(msg) {
			w.c[cCoalesced].Add(uint64((len(msg) + seg - 1) / seg))
		}
		for first := true; first || len(msg) > 0; first = false { // an empty datagram is one too
			var pkt []byte
			pkt, msg = nextDatagram(msg, seg)
			if m := w.handleAt(pkt, trunc || len(pkt) > wire.MaxDatagram, w.bc.sbufs[k][:0], now); m > 0 {
				w.bc.setReply(k, i, m)
				if k++; k == MaxBatch { // a turn of coalesced messages: send slots are full
					w.sendReplies(k)
					k = 0
				}
			}
		}
	}
	w.sendReplies(k)
}

// sendReplies sends the first k send slots of the turn.
func (w *worker) sendReplies(k int) {
	if k == 0 {
		return
	}
	failed, _ := w.bc.send(k)
	w.c[cResponses].Add(uint64(k - failed))
	if failed > 0 {
		w.c[cSendErrors].Add(uint64(failed))
	}
}

func dropFor(err error) drop {
	switch err {
	case wire.ErrTooLarge:
		return dropTooLarge
	case wire.ErrTruncated:
		return dropTruncated
	case wire.ErrMagic:
		return dropMagic
	case wire.ErrVersion:
		return dropVersion
	case wire.ErrKind:
		return dropKind
	case wire.ErrAuth, wire.ErrKeyID:
		return dropAuth
	}
	return dropMalformed
}

// handle processes one datagram and writes the answer, if any, into out
// (capacity wire.MaxDatagram), returning its length (0 = no answer).
func (w *worker) handle(pkt []byte, truncated bool, out []byte) int {
	return w.handleAt(pkt, truncated, out, w.s.now())
}

// handleAt is handle at time now. A read turn passes the time it read
// once for all its datagrams (they arrived together): its decisions lag
// per-datagram reads by at most the turn's length, microseconds against
// the wire's millisecond timestamps and 30 s skew, and a bucket refills
// from a time never later than the true one. Read per datagram, the
// clock was one time.Now (two vDSO calls) for every request decided.
func (w *worker) handleAt(pkt []byte, truncated bool, out []byte, now time.Time) int {
	w.inc(cReceived)
	if truncated {
		w.dropped(dropTooLarge)
		return 0
	}
	h := &w.h
	if err := h.Decode(pkt); err != nil {
		w.dropped(dropFor(err))
		return 0
	}
	ke := w.s.keys[h.KeyID]
	if ke == nil {
		w.dropped(dropUnknownKey)
		return 0
	}
	pt, err := ke.key.Open(pkt, h)
	if err != nil {
		w.dropped(dropFor(err))
		return 0
	}
	if wire.CheckTime(h, now, wire.DefaultSkew) != nil {
		w.dropped(dropStale)
		return 0
	}
	if ke.maxHorizonMs > 0 && int64(h.TTLms) > ke.maxHorizonMs {
		w.dropped(dropHorizon)
		return 0
	}
	if hk := w.s.cfg.Hooks; hk != nil && hk.DropRequest != nil && hk.DropRequest(h) {
		w.dropped(dropHook)
		return 0
	}
	switch h.Kind {
	case wire.KindRateRequest:
		if err := w.req.DecodeBody(pt); err != nil {
			w.dropped(dropMalformed)
			return 0
		}
		return w.rateRequest(ke, now.UnixNano(), out)
	case wire.KindLatencyReport:
		if err := w.rep.DecodeBody(pt); err != nil {
			w.dropped(dropMalformed)
			return 0
		}
		w.report(ke, now.UnixNano())
	case wire.KindCompletion:
		if err := w.comp.DecodeBody(pt); err != nil {
			w.dropped(dropMalformed)
			return 0
		}
		w.completion(ke, now.UnixNano())
	default:
		w.dropped(dropKind)
	}
	return 0
}

// until is how long an id must be remembered: as long as a datagram of it
// can pass the timestamp check (docs/protocol.md §6.4).
func (w *worker) until() int64 {
	return int64(w.h.Timestamp) + int64(w.h.TTLms) + w.s.skewMs
}

func (w *worker) rateRequest(ke *keyEntry, nowNs int64, out []byte) int {
	nowMs := nowNs / 1e6
	dk := dedupKey{keyID: w.h.KeyID, id: w.h.RequestID}
	d := w.s.dedup
	ds, tag := d.shard(dk)
	ds.mu.Lock()
	if i := d.lookup(ds, dk, tag, nowMs); i >= 0 {
		sl := &ds.ring[i]
		if sl.n == 0 { // the id of a report: not a request we decided
			ds.mu.Unlock()
			w.dropped(dropReplayedReport)
			return 0
		}
		sl.until = max(sl.until, w.until())
		n := w.answer(ke, ds.body(i), nowMs, out)
		ds.mu.Unlock()
		w.inc(cReplays)
		return n
	}
	i := d.insert(ds, dk, tag, w.until(), nowMs)
	w.decide(ke, &w.req, modeRequest, nowNs)
	w.inc(cRequests)
	switch {
	case w.resp.Status != wire.StatusOK:
		w.inc(cMalformed)
	case w.resp.Success:
		w.inc(cAllows)
	default:
		w.inc(cDenies)
	}
	if hk := w.s.cfg.Hooks; hk != nil && hk.MutateResponse != nil {
		hk.MutateResponse(&w.resp)
	}
	body, err := w.resp.AppendBody(w.body[:0])
	if err != nil { // only a hook can make the response unencodable
		ds.mu.Unlock()
		w.dropped(dropInternal)
		return 0
	}
	ds.setBody(i, body)
	n := w.answer(ke, body, nowMs, out)
	ds.mu.Unlock()
	return n
}

// answer seals a RATE_RESPONSE body under a header echoing the request.
func (w *worker) answer(ke *keyEntry, body []byte, nowMs int64, out []byte) int {
	rh := &w.rh
	*rh = wire.Header{
		Kind:      wire.KindRateResponse,
		Flags:     w.h.Flags&wire.FlagReplay | wire.FlagSteering,
		Attempt:   w.h.Attempt,
		TTLms:     w.h.TTLms,
		RequestID: w.h.RequestID,
		Timestamp: uint64(nowMs),
	}
	steer := w.overloaded
	if hk := w.s.cfg.Hooks; hk != nil && hk.ForceSteer != nil && hk.ForceSteer(&w.h) {
		steer = true
	}
	if steer {
		rh.Flags &^= wire.FlagSteering
		w.inc(cSteered)
	}
	if nonce(&rh.Nonce) != nil {
		w.dropped(dropInternal)
		return 0
	}
	pkt, err := ke.key.SealBody(out, rh, body)
	if err != nil {
		w.dropped(dropInternal)
		return 0
	}
	return len(pkt)
}

func (w *worker) report(ke *keyEntry, nowNs int64) {
	nowMs := nowNs / 1e6
	dk := dedupKey{keyID: w.h.KeyID, id: w.h.RequestID}
	d := w.s.dedup
	ds, tag := d.shard(dk)
	ds.mu.Lock()
	if d.lookup(ds, dk, tag, nowMs) >= 0 {
		ds.mu.Unlock()
		w.dropped(dropReplayedReport)
		return
	}
	d.insert(ds, dk, tag, w.until(), nowMs)
	ds.mu.Unlock()
	for i := range w.rep.Entries {
		w.track(ke, w.rep.Entries[i].Service, w.rep.Entries[i].DurationMs, nowNs)
	}
	w.inc(cReports)
	w.c[cReportEntries].Add(uint64(len(w.rep.Entries)))
}

// track adds one latency sample to the tracker of service.
func (w *worker) track(ke *keyEntry, service []byte, ms uint32, nowNs int64) {
	t := w.s.trackers
	w.key = append(append(w.key[:0], ke.prefix...), service...)
	sh := &t.shards[t.shardIndex(w.key)]
	sh.mu.Lock()
	tr, _ := t.getOrCreate(sh, w.key)
	tr.add(nowNs, ms)
	sh.mu.Unlock()
}

func (w *worker) completion(ke *keyEntry, nowNs int64) {
	nowMs := nowNs / 1e6
	w.inc(cCompletions)
	dk := dedupKey{keyID: w.h.KeyID, id: w.h.RequestID}
	d := w.s.dedup
	ds, tag := d.shard(dk)
	ds.mu.Lock()
	defer ds.mu.Unlock()
	if i := d.lookup(ds, dk, tag, nowMs); i >= 0 {
		sl := &ds.ring[i]
		// Keep the id as long as this completion can pass the timestamp
		// check: a captured copy re-sent later must still find it.
		sl.until = max(sl.until, w.until())
		w.inc(cCompletionsIgnored)
		return
	}
	i := d.insert(ds, dk, tag, w.until(), nowMs)
	m := modeForceDeny
	if w.comp.Decision == wire.DecisionAllow {
		m = modeForceAllow
	}
	w.decide(ke, &w.comp.Request, m, nowNs)
	if body, err := w.resp.AppendBody(w.body[:0]); err == nil {
		ds.setBody(i, body)
	}
	w.inc(cCompletionsApplied)
}

// decide evaluates req into w.resp: guards first, then every resource
// under its bucket shard's lock (all shards locked in ascending order), all
// or nothing.
func (w *worker) decide(ke *keyEntry, req *wire.RateRequest, m mode, nowNs int64) {
	resp := &w.resp
	resp.Reset()
	resp.ServerEpoch = w.s.epoch
	resp.Status = wire.StatusOK
	if len(req.Guards) == 0 && len(req.Resources) == 0 {
		resp.Status = wire.StatusMalformed
		return
	}
	for i := range req.Resources {
		if req.Resources[i].Rate == 0 || req.Resources[i].PeriodMs == 0 {
			resp.Status = wire.StatusMalformed
			return
		}
	}

	guardsOK := true
	tt := w.s.trackers
	for i := range req.Guards {
		g := &req.Guards[i]
		w.key = append(append(w.key[:0], ke.prefix...), g.Service...)
		sh := &tt.shards[tt.shardIndex(w.key)]
		sh.mu.Lock()
		var est uint32
		var ok bool
		if tr := sh.m[string(w.key)]; tr != nil {
			est, ok = tr.estimate(nowNs)
		}
		sh.mu.Unlock()
		passed := !ok || est <= g.ThresholdMs || m == modeForceAllow
		guardsOK = guardsOK && passed
		resp.Guards = append(resp.Guards, wire.GuardResult{Passed: passed, ObservedMs: est})
	}

	bt := w.s.buckets
	var mask uint64
	for i := range req.Resources {
		w.key = append(append(w.key[:0], ke.prefix...), req.Resources[i].Bucket...)
		idx := bt.shardIndex(w.key)
		w.shard[i] = uint8(idx)
		mask |= 1 << idx
	}
	for bm := mask; bm != 0; bm &= bm - 1 {
		bt.shards[bits.TrailingZeros64(bm)].mu.Lock()
	}
	short := false
	for i := range req.Resources {
		r := &req.Resources[i]
		w.key = append(append(w.key[:0], ke.prefix...), r.Bucket...)
		b, created := bt.getOrCreate(&bt.shards[w.shard[i]], w.key)
		if created {
			b.tokens = float64(capacityOf(r.Rate, r.Burst))
			b.last = nowNs
		}
		b.refill(nowNs, r.Rate, r.PeriodMs, r.Burst)
		w.rb[i] = b
		t := b.tokens
		w.orig[i], w.seen[i] = t, t
		c := float64(r.Cost)
		switch {
		case m == modeForceAllow:
			b.tokens = max(0, t-c)
		case t >= c:
			b.tokens = t - c
		default:
			short = true
		}
	}
	allow := m == modeForceAllow || (m == modeRequest && guardsOK && !short)
	if !allow {
		for i := len(req.Resources) - 1; i >= 0; i-- { // reverse: the first touch holds the true original
			w.rb[i].tokens = w.orig[i]
		}
	}
	for i := range req.Resources {
		r := &req.Resources[i]
		var rr wire.ResourceResult
		rr.Remaining = clampU32(math.Floor(w.rb[i].tokens))
		if t, c := w.seen[i], float64(r.Cost); t < c && m != modeForceAllow {
			rr.TokensDeficit = clampU32(math.Ceil(c - t))
			rr.RetryAfterMs = max(1, clampU32(math.Ceil((c-t)*float64(r.PeriodMs)/float64(r.Rate))))
		}
		resp.Resources = append(resp.Resources, rr)
	}
	for bm := mask; bm != 0; bm &= bm - 1 {
		bt.shards[bits.TrailingZeros64(bm)].mu.Unlock()
	}
	resp.Success = allow
}

func clampU32(f float64) uint32 {
	switch {
	case f <= 0 || f != f:
		return 0
	case f >= math.MaxUint32:
		return math.MaxUint32
	}
	return uint32(f)
}
