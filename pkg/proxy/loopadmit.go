package proxy

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rl-tproxy/rl-tproxy/pkg/exchange"
	"github.com/rl-tproxy/rl-tproxy/pkg/httpparse"
)

// reqState is the state of one request in flight on a loop, taken from the
// loop's free list for the request's lifetime (idle connections hold
// none).
type reqState struct {
	c    *clientConn
	cfg  *Config
	svc  *exchange.Service
	hook exchange.Hook
	head httpparse.Request
	req  exchange.Request
	dec  exchange.Decision
	res  exchange.Result
	// actx is a blocking Hook's Admit context, made on first use and kept
	// by reset (its timer's function may still be running, finding
	// nothing to do); admitDeadline starts it.
	actx *exchange.AdmitContext

	resumeFn func() // r.resume, made once
	asyncFn  func() // r.asyncResume, made once
	async    AsyncHook
	chunk    httpparse.ChunkedDecoder
	rchunk   httpparse.ChunkedDecoder
	up       *upstreamConn // upstream connection of the exchange
	upStart  time.Time     // start of the upstream exchange (Result.UpstreamTTFB)

	bodyLeft int64 // Content-Length body bytes still to send
	bodyIn   int64 // chunked body bytes decoded
	respLeft int64 // response body bytes still to relay
	splMark  int64 // bytes the body's splice had moved at the last deadline
	rp       uint8 // response phase

	interims httpparse.Interims // interim (1xx) responses received

	bodyDone  bool // the request body was sent (or there is none)
	keep      bool // the client connection stays after this request
	upKeep    bool // the upstream connection may be pooled after the response
	admitted  bool // reached the Hook: Done is owed
	pending   bool // the Hook's Decision is not back yet
	cancelled bool // Cancel (or the Admit context's cancel) was called
	sent100   bool
	canRetry  bool
	retried   bool
	upBytes   bool // a response byte arrived
	chunkedRs bool // the response body goes out re-encoded chunked
	splicing  bool // a body goes by splice (loopsplice.go)
	splIn     bool // ... the request body, from the client to r.up
}

func (r *reqState) reset() {
	hs, ch, rch := r.head.Headers, r.chunk, r.rchunk
	fn, afn, actx := r.resumeFn, r.asyncFn, r.actx
	*r = reqState{resumeFn: fn, asyncFn: afn, actx: actx, chunk: ch, rchunk: rch}
	r.head.Headers = hs
	r.head.Reset()
}

// admit asks the Hook: an AsyncHook through Begin (its Resume comes back
// to the loop through Post), a blocking Hook on a worker goroutine whose
// Decision comes back the same way.
func (c *clientConn) admit() {
	r := c.r
	r.admitted = true
	r.pending = true
	r.req.Loop = c.ls.l
	if ah, ok := r.hook.(AsyncHook); ok {
		r.async = ah
		if ah.Begin(&r.req, &r.dec, r) {
			r.pending = false
			c.admitDone()
		}
		return
	}
	c.ls.lg.workers.run(r)
}

// Resume implements Resumer for AsyncHook.Begin; any goroutine.
func (r *reqState) Resume() { r.c.ls.l.Post(r.asyncFn) }

// ResumeOnLoop implements LoopResumer: the loop's thread, outside the
// proxy's own calls.
func (r *reqState) ResumeOnLoop() { r.asyncResume() }

// asyncResume runs on the loop when an AsyncHook resumed r.
func (r *reqState) asyncResume() {
	r.pending = false
	r.c.admitDone()
}

// runAdmit runs on a worker goroutine.
func (r *reqState) runAdmit() {
	r.dec = r.hook.Admit(r.actx, &r.req)
	r.actx.Finish()
	r.c.ls.l.Post(r.resumeFn)
}

// resume runs on the loop when the Decision is back.
func (r *reqState) resume() {
	r.c.ls.lg.workers.busy.Add(-1)
	r.pending = false
	r.c.admitDone()
}

// cancelAdmit tells the Hook that the client went away; the Decision
// still comes back (resume or asyncResume) before r is reused.
func (r *reqState) cancelAdmit() {
	if r.async != nil {
		r.async.Cancel(&r.req)
		return
	}
	r.actx.Cancel(context.Canceled)
}

// admitDone acts on the Hook's Decision.
func (c *clientConn) admitDone() {
	r := c.r
	if r.res.AdmissionErr != nil {
		c.lateDecision()
		return
	}
	if c.state == lcGone || c.s == nil {
		r.res.ClientAborted = true
		c.close()
		return
	}
	if !r.dec.Allow {
		c.deny()
		return
	}
	c.forward()
}

// admitWorkerIdle is how long an idle admission worker goroutine waits
// for work before it exits.
const admitWorkerIdle = 10 * time.Second

// admitWorkers is a pool of goroutines that run blocking Hook.Admit
// calls for the loops (a goroutine per request would allocate). An idle
// worker exits after idleTimeout; Shutdown ends them all.
type admitWorkers struct {
	mu          sync.Mutex
	idle        []chan *reqState
	closed      bool
	busy        atomic.Int64 // admissions handed out and not resumed yet
	idleTimeout time.Duration
}

func (w *admitWorkers) run(r *reqState) {
	w.busy.Add(1)
	w.mu.Lock()
	if n := len(w.idle); n > 0 {
		ch := w.idle[n-1]
		w.idle[n-1] = nil
		w.idle = w.idle[:n-1]
		w.mu.Unlock()
		ch <- r
		return
	}
	w.mu.Unlock()
	ch := make(chan *reqState, 1)
	go w.loop(ch)
	ch <- r
}

func (w *admitWorkers) loop(ch chan *reqState) {
	t := time.NewTimer(w.idleTimeout)
	defer t.Stop()
	for {
		select {
		case r, ok := <-ch:
			if !ok {
				return
			}
			r.runAdmit()
			w.mu.Lock()
			if w.closed {
				w.mu.Unlock()
				return
			}
			w.idle = append(w.idle, ch)
			w.mu.Unlock()
			t.Reset(w.idleTimeout)
		case <-t.C:
			w.mu.Lock()
			for i, c := range w.idle {
				if c == ch {
					copy(w.idle[i:], w.idle[i+1:])
					w.idle[len(w.idle)-1] = nil
					w.idle = w.idle[:len(w.idle)-1]
					w.mu.Unlock()
					return
				}
			}
			w.mu.Unlock() // taken by run: a job is on its way
		}
	}
}

func (w *admitWorkers) close() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.closed = true
	for _, ch := range w.idle {
		close(ch)
	}
	w.idle = nil
}

// deny answers the Decision's status, fields and body.
func (c *clientConn) deny() {
	r := c.r
	h := &r.head
	d := &r.dec
	status := d.Status
	if status < 200 || status > 599 {
		status = 429
	}
	keep := c.keepClient()
	switch h.BodyMode() {
	case httpparse.BodyLength:
		if int64(c.buf.w-c.buf.r) >= h.ContentLength {
			c.buf.r += int(h.ContentLength)
			r.res.BytesIn = h.ContentLength
			r.bodyDone = true
		} else {
			keep = false
		}
	case httpparse.BodyChunked:
		keep = false
	}
	b := c.ls.scratch[:0]
	b = appendStatusLine(b, status, nil)
	for i := range d.Header {
		b = appendHeaderBytes(b, d.Header[i].Name, d.Header[i].Value)
	}
	if d.ContentType != "" {
		b = append(b, "Content-Type: "...)
		b = append(b, d.ContentType...)
		b = append(b, "\r\n"...)
	}
	b = append(b, "Content-Length: "...)
	b = strconv.AppendInt(b, int64(len(d.Body)), 10)
	b = append(b, "\r\n"...)
	if !keep {
		b = append(b, "Connection: close\r\n"...)
	}
	b = append(b, "\r\n"...)
	var body []byte
	if !httpparse.EqualFold(h.Method, "HEAD") {
		body = d.Body
	}
	c.ls.write2(c.s, b, body)
	r.res.Status = status
	r.res.BytesOut = int64(len(b) + len(body))
	if !keep {
		c.linger = true
	}
	c.complete(keep)
}

// answer writes a short plain-text answer from the proxy itself.
func (c *clientConn) answer(status int, extra string) {
	b := c.ls.scratch[:0]
	b = appendStatusLine(b, status, nil)
	text := statusBody(status)
	b = append(b, "Content-Type: text/plain; charset=utf-8\r\nContent-Length: "...)
	b = strconv.AppendInt(b, int64(len(text)), 10)
	b = append(b, "\r\n"...)
	b = append(b, extra...)
	b = append(b, "\r\n"...)
	b = append(b, text...)
	if c.s != nil {
		c.ls.write2(c.s, b, nil)
	}
	if r := c.r; r != nil {
		r.res.Status = status
		r.res.BytesOut += int64(len(b))
	}
}

// reject answers a parse error with its status and closes.
func (c *clientConn) reject(cfg *Config, svc *exchange.Service, err error) {
	status := 400
	rule := "malformed"
	var pe *httpparse.Error
	if errors.As(err, &pe) {
		status, rule = pe.Status, pe.Rule
	}
	c.rejectRule(cfg, svc, rule, status)
}

// rejectRule answers status for a violated rule, logs and reports it,
// and closes the connection gracefully.
func (c *clientConn) rejectRule(cfg *Config, svc *exchange.Service, rule string, status int) {
	cfg.Log().Debug("request rejected", "service", svc.Name, "rule", rule, "status", status, "remote", c.remote)
	cfg.ReportReject(svc, c.remote, rule, status)
	c.answer(status, "Connection: close\r\n")
	c.linger = true
	if c.r != nil && c.r.svc == nil {
		c.ls.putReq(c.r) // parsed but not started: nothing to report
		c.r = nil
	}
	c.complete(false)
}

// upstreamFail answers 502 (504 on a timeout) when nothing was sent to
// the client yet, and closes the client connection.
func (c *clientConn) upstreamFail(err error) {
	r := c.r
	r.res.UpstreamErr = err
	status := 502
	if isTimeout(err) {
		status = 504
	}
	r.cfg.Log().Debug("upstream failed", "service", r.svc.Name, "upstream", r.svc.Upstream, "err", err)
	if r.res.Status == 0 {
		c.answer(status, "Connection: close\r\n")
	}
	c.linger = true
	c.complete(false)
}
