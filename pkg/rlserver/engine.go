package rlserver

import (
	"errors"
	"math"
	"time"

	"github.com/rl-tproxy/rl-tproxy/pkg/ratelimitly/wire"
)

// Engine is the server's decision without its sockets: the same token
// buckets, latency trackers and all-or-nothing decision, driven by the
// caller on the caller's clock (virtual time), with no wire crypto, no
// dedup and no background sweeping. rl-tproxy simulate replays access
// logs through it. It is not safe for concurrent use.
type Engine struct {
	s  *Server
	w  *worker
	ke *keyEntry
}

// NewEngine returns an Engine for one tenant whose server_epoch is epoch;
// maxBuckets and maxTrackers bound its state as Config's fields do (0 =
// the defaults).
func NewEngine(tenant string, epoch time.Time, maxBuckets, maxTrackers int) (*Engine, error) {
	if len(tenant) > math.MaxUint16 {
		return nil, errors.New("rlserver: tenant name too long")
	}
	if maxBuckets <= 0 {
		maxBuckets = DefaultMaxBuckets
	}
	if maxTrackers <= 0 {
		maxTrackers = DefaultMaxTrackers
	}
	s := &Server{epoch: uint64(epoch.UnixMilli())}
	s.buckets = newTable(maxBuckets, func(b *bucket) int64 { return b.used }, func(b *bucket, now int64) bool { return b.full(now) })
	s.trackers = newTable(maxTrackers, func(t *tracker) int64 { return t.used }, func(t *tracker, now int64) bool { return t.empty(now) })
	p := append([]byte{byte(len(tenant) >> 8), byte(len(tenant))}, tenant...)
	return &Engine{s: s, w: newWorker(s, 0, nil), ke: &keyEntry{prefix: p}}, nil
}

// Decide answers req at now as a server would (a request seen for the
// first time). The response is the Engine's and valid until the next call.
func (e *Engine) Decide(req *wire.RateRequest, now time.Time) *wire.RateResponse {
	e.w.decide(e.ke, req, modeRequest, now.UnixNano())
	return &e.w.resp
}

// Report adds a latency sample of durationMs to service's tracker at now.
func (e *Engine) Report(service []byte, durationMs uint32, now time.Time) {
	e.w.track(e.ke, service, durationMs, now.UnixNano())
}

// Sweep drops the state that is idle at now (full buckets, trackers with
// no sample in the window), as the server's sweeper does every second.
func (e *Engine) Sweep(now time.Time) {
	e.s.buckets.sweep(now.UnixNano())
	e.s.trackers.sweep(now.UnixNano())
}

// Buckets is the number of buckets held.
func (e *Engine) Buckets() int { return int(e.s.buckets.count.Load()) }
