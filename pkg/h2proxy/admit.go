package h2proxy

import (
	"context"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/rl-tproxy/rl-tproxy/pkg/exchange"
)

// The admission deadline (exchange.Config.AdmissionTimeout, a Service's own
// winning). Admit gets a context that carries the deadline. A Hook that
// returns when its context ends (exchange.ContextBound: hook.Gate) is called
// on the stream's goroutine, and a Decision that comes back after the
// deadline is not used: the stream is answered 503 as below and gets Done
// with Result.AdmissionErr. Any other Hook's Admit runs on a goroutine of
// its own, and the stream's handler waits for the Decision
// or the context's end, whichever comes first: a Hook that ignores its
// context cannot hold the stream (the codec answers a stream only when
// its handler returns). When the deadline passes first the stream is
// answered 503 (a gRPC request UNAVAILABLE), reported as
// "admission-timeout", and handed to the Admit goroutine, which calls
// Done with Result.AdmissionErr set once the Hook returns and then puts
// the stream back in the pool: until then the Request and Decision are
// the Hook's. A Decision that comes back after the deadline passed is not
// used either. Only the stream ends; the connection's other streams go on.

// admission is a stream's Admit call. ch and fn are made once per pooled
// stream (putStream keeps them), so an admission allocates only its
// context and the goroutine.
type admission struct {
	hook exchange.Hook
	ctx  context.Context // Admit's: the request's, with the deadline
	// state says who owns the stream once Admit returns (admit*).
	state atomic.Int32
	// refs counts the handler and the Admit goroutine after the handler
	// gave up: the last one to finish with the stream calls Done.
	refs atomic.Int32
	ch   chan struct{} // the Decision is in (admitDecided), 1 buffered
	fn   func()        // st.runAdmit
}

// admitGoroutines counts the Admit calls that ran on a goroutine of their
// own (tests: a ContextBound Hook's never do).
var admitGoroutines atomic.Int64

const (
	admitPending   int32 = iota // Admit is running, the handler waits
	admitDecided                // Admit returned first: ch tells the handler
	admitAbandoned              // the handler stopped waiting first
)

// admit asks the Hook for the stream's decision within the admission
// timeout. It returns false when the stream was answered (or its client
// went away) before the Decision came back: the stream then belongs to
// the Admit goroutine (runAdmit), which calls Done; the handler must not
// touch it. Otherwise the handler owns it and calls Done; res.AdmissionErr
// is set when the Decision came too late and the stream was answered 503.
//
//go:noinline
func (st *stream) admit(hook exchange.Hook, w http.ResponseWriter, r *http.Request) bool {
	h := st.h
	timeout := h.cfg.AdmissionTimeoutFor(h.svc)
	if _, ok := hook.(exchange.ContextBound); ok {
		c := st.actx
		if c == nil {
			c = &exchange.AdmitContext{}
			st.actx = c
		}
		c.Start(r.Context(), time.Now().Add(timeout))
		st.dec = hook.Admit(c, &st.req)
		err := c.Err()
		c.Finish()
		if err != nil {
			st.giveUp(w, r)
		}
		return true
	}
	// A context per admission: the Admit goroutine may outlive this call.
	ctx := new(exchange.AdmitContext)
	ctx.Start(r.Context(), time.Now().Add(timeout))
	defer ctx.Finish()
	admitGoroutines.Add(1)
	a := &st.adm
	if a.fn == nil {
		a.ch = make(chan struct{}, 1)
		a.fn = st.runAdmit
	}
	a.hook, a.ctx = hook, ctx
	a.state.Store(admitPending)
	a.refs.Store(2)
	go a.fn()
	select {
	case <-a.ch:
	case <-ctx.Done():
		if a.state.CompareAndSwap(admitPending, admitAbandoned) {
			st.giveUp(w, r)
			// Admit may have returned meanwhile: then the stream is ours
			// again (runAdmit left it), else runAdmit finishes it.
			return a.refs.Add(-1) == 0
		}
		<-a.ch // the Decision came back as the deadline passed
	}
	if ctx.Err() != nil && r.Context().Err() == nil {
		st.admissionTimedOut(w) // decided after the deadline: not used
	}
	return true
}

// runAdmit runs Admit on its own goroutine (admit starts it).
func (st *stream) runAdmit() {
	a := &st.adm
	st.dec = a.hook.Admit(a.ctx, &st.req)
	if a.state.CompareAndSwap(admitPending, admitDecided) {
		a.ch <- struct{}{} // the handler takes it from here
		return
	}
	if a.refs.Add(-1) == 0 { // the handler answered and returned
		st.done(a.hook)
		putStream(st)
	}
}

// giveUp ends a stream whose handler stopped waiting for the Decision:
// the client went away, or the admission timed out.
func (st *stream) giveUp(w http.ResponseWriter, r *http.Request) {
	if r.Context().Err() != nil {
		st.res.ClientAborted = true
		return
	}
	st.admissionTimedOut(w)
}

// admissionTimedOut answers a stream whose Decision did not come within
// the admission timeout.
//
//go:noinline
func (st *stream) admissionTimedOut(w http.ResponseWriter) {
	h := st.h
	d := h.cfg.AdmissionTimeoutFor(h.svc)
	st.res.AdmissionErr = exchange.AdmissionTimeoutError(d)
	h.cfg.ReportReject(h.svc, h.remote, "admission-timeout", http.StatusServiceUnavailable)
	h.cfg.Log().Debug("http2 admission timed out", "service", h.svc.Name, "remote", h.remote, "timeout", d)
	st.fail(w, http.StatusServiceUnavailable)
}
