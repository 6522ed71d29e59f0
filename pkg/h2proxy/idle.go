package h2proxy

import (
	"net/http"
	"sync"
	"sync/atomic"
	"time"
)

// Stream idle timeouts: the HTTP/1.1 idle timeout (Service.IdleTimeout,
// `timeouts.idle`) applied per stream, as the HTTP/1.1 path applies it to
// a request's body and to an answer the client does not take.
//
//   - body idle ("body-timeout"): the proxy waits for the client's request
//     body (the upstream is taking it) and the client sent none of it, and
//     no response byte reached the client either, for the whole timeout
//     (a stream whose HEADERS did not end it and that never sends DATA is
//     such a stream). A bidirectional stream whose response flows is not
//     idle.
//   - send idle ("send-timeout"): a write of the response to the client
//     made no progress for the whole timeout (a client with a zero window,
//     or one that stopped reading).
//
// Either resets the stream (RST_STREAM INTERNAL_ERROR, through the
// writer's deadlines, the codec's documented way), ends the upstream
// exchange, gives the stream Result.ClientAborted (no report, as an
// HTTP/1.1 client that stalls is aborted) and is counted as a rejection
// with status 0 (Config.ReportReject).
type idleWatch struct {
	mu    sync.Mutex
	rw    deadliner  // the stream's writer while armed; nil otherwise
	body  *bodyCount // the request body being read, if any
	idle  int64      // ns
	timer *time.Timer
	fire  func() // w.check, made once
	rule  string // what fired, "" if nothing

	writing   atomic.Bool
	lastWrite atomic.Int64 // mono() at the start or end of the last write
}

type deadliner interface {
	SetReadDeadline(time.Time) error
	SetWriteDeadline(time.Time) error
}

var monoBase = time.Now()

// mono is a monotonic clock in ns.
func mono() int64 { return int64(time.Since(monoBase)) }

// arm starts watching the stream written through w (with its request
// body, if any) for idle periods of d. It reports false, changing
// nothing, when the watch is armed already (or w has no deadlines).
func (w *idleWatch) arm(rw http.ResponseWriter, body *bodyCount, d time.Duration) bool {
	dl, ok := rw.(deadliner)
	if !ok || d <= 0 {
		return false
	}
	w.mu.Lock()
	if w.rw != nil {
		w.mu.Unlock()
		return false
	}
	w.rw, w.body, w.idle, w.rule = dl, body, int64(d), ""
	w.writing.Store(false)
	w.lastWrite.Store(mono())
	if w.timer == nil {
		w.fire = w.check
		w.timer = time.AfterFunc(d, w.fire)
	} else {
		w.timer.Reset(d)
	}
	w.mu.Unlock()
	return true
}

// setBody adds the request body to what is watched.
func (w *idleWatch) setBody(body *bodyCount) {
	w.mu.Lock()
	w.body = body
	w.mu.Unlock()
}

// disarm stops watching; it returns the rule that fired, if one did. The
// writer is not touched after disarm returns.
func (w *idleWatch) disarm() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.rw == nil {
		return ""
	}
	w.rw, w.body = nil, nil
	w.timer.Stop()
	return w.rule
}

// writeStart and writeEnd bracket a write to the client.
func (w *idleWatch) writeStart() {
	w.lastWrite.Store(mono())
	w.writing.Store(true)
}

func (w *idleWatch) writeEnd() {
	w.writing.Store(false)
	w.lastWrite.Store(mono())
}

// check is the timer's callback: it ends the stream when it has been
// idle for the timeout, else waits until it could be.
func (w *idleWatch) check() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.rw == nil || w.rule != "" {
		return
	}
	now := mono()
	var next int64
	w.rule, next = w.decide(now)
	if w.rule == "" {
		w.timer.Reset(time.Duration(max(next-now, w.idle/16, int64(time.Millisecond))))
		return
	}
	past := time.Unix(1, 0)
	_ = w.rw.SetReadDeadline(past)  // a body read waiting ends
	_ = w.rw.SetWriteDeadline(past) // the stream is reset, a write waiting ends
}

// decide returns the rule the stream broke at now ("" if none) and,
// when none, the earliest time it could.
func (w *idleWatch) decide(now int64) (string, int64) {
	lastWrite := w.lastWrite.Load()
	if w.writing.Load() && now-lastWrite >= w.idle {
		return "send-timeout", 0
	}
	next := lastWrite + w.idle
	if w.body != nil && w.body.reading.Load() {
		last := max(w.body.lastRead.Load(), lastWrite)
		if now-last >= w.idle {
			return "body-timeout", 0
		}
		next = last + w.idle
	}
	return "", next
}
