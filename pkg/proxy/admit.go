package proxy

import (
	"context"
	"sync"
	"time"
)

// admitCtx is the context handed to Hook.Admit. It is reused by the
// connection's next request (so a Hook must not keep it after Admit
// returns); its Done channel is made only when someone asks for it and
// replaced only after a cancellation.
type admitCtx struct {
	mu   sync.Mutex
	done chan struct{}
	err  error
}

var closedChan = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

func (a *admitCtx) Deadline() (time.Time, bool) { return time.Time{}, false }
func (a *admitCtx) Value(any) any               { return nil }

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

func (a *admitCtx) cancel() {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.err != nil {
		return
	}
	a.err = context.Canceled
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

// watchers is a pool of goroutines that watch a client socket for a
// connection (starting a goroutine per request would allocate). Idle
// watchers park on their channel until Shutdown.
//
// Bound: a watcher rejoins the idle list before it signals its connection
// that it is done, so a connection never starts its next watch while its
// previous watcher is still on its way back. The number of watcher
// goroutines is therefore at most the peak number of connections watched
// at once (each connection has at most one watcher running), which is at
// most the peak number of open connections.
type watchers struct {
	mu      sync.Mutex
	idle    []chan *conn
	closed  bool
	started int // watcher goroutines started (tests)
}

func (w *watchers) start(c *conn) {
	w.mu.Lock()
	if n := len(w.idle); n > 0 {
		ch := w.idle[n-1]
		w.idle = w.idle[:n-1]
		w.mu.Unlock()
		ch <- c
		return
	}
	w.started++
	w.mu.Unlock()
	ch := make(chan *conn, 1)
	go w.loop(ch)
	ch <- c
}

func (w *watchers) loop(ch chan *conn) {
	for c := range ch {
		c.watch()
		w.mu.Lock()
		closed := w.closed
		if !closed {
			w.idle = append(w.idle, ch) // before the signal: see watchers
		}
		w.mu.Unlock()
		c.watchDone <- struct{}{} // c is not touched after this
		if closed {
			return
		}
	}
}

func (w *watchers) close() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.closed = true
	for _, ch := range w.idle {
		close(ch)
	}
	w.idle = nil
}
