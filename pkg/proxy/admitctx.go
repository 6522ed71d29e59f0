package proxy

import (
	"context"
	"sync"
	"time"
)

// admitCtx is the context handed to a blocking Hook's Admit (run on a
// worker goroutine, loopadmit.go). It is reused by the connection's next
// request (so a Hook must not keep it after Admit returns); its Done
// channel is made only when someone asks for it and replaced only after a
// cancellation.
type admitCtx struct {
	mu       sync.Mutex
	done     chan struct{}
	err      error
	deadline time.Time // the admission deadline (Config.AdmissionTimeout)
}

var closedChan = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

func (a *admitCtx) Value(any) any { return nil }

func (a *admitCtx) Deadline() (time.Time, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.deadline, !a.deadline.IsZero()
}

// setDeadline sets what Deadline reports (before Admit runs).
func (a *admitCtx) setDeadline(t time.Time) {
	a.mu.Lock()
	a.deadline = t
	a.mu.Unlock()
}

func (a *admitCtx) Done() <-chan struct{} {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.done == nil {
		a.done = make(chan struct{})
	}
	return a.done
}

func (a *admitCtx) Err() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.err
}

func (a *admitCtx) cancel() { a.cancelWith(context.Canceled) }

// cancelWith ends the context with err (context.Canceled: the client
// went away; context.DeadlineExceeded: the admission timed out).
func (a *admitCtx) cancelWith(err error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.err != nil {
		return
	}
	a.err = err
	if a.done == nil {
		a.done = closedChan
	} else {
		close(a.done)
	}
}

// reset readies a for the next request.
func (a *admitCtx) reset() {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.err != nil {
		a.err, a.done = nil, nil
	}
}
