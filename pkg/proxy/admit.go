package proxy

import (
	"context"
	"sync"
	"sync/atomic"
	"time"
)

// admitCtx is the context handed to Hook.Admit. It is reused by the
// connection's next request (so a Hook must not keep it after Admit
// returns); its Done channel is made only when someone asks for it and
// replaced only after a cancellation.
type admitCtx struct {
	c    *conn // whose admission (WatchClient); set once
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

// WatchClient starts watching the client of the request that ctx (the
// context Hook.Admit received from the proxy) is admitting, in the
// admission mode of watch.go, unless a watcher runs already: ctx is then
// cancelled when the client goes away. A Hook that implements
// OnDemandWatcher calls it from Admit's goroutine before it waits; on any
// other context it does nothing.
func WatchClient(ctx context.Context) {
	if a, ok := ctx.(*admitCtx); ok && a.c != nil {
		a.c.watchAdmitPhase()
	}
}

// watchers is a pool of goroutines that watch a client socket for a
// connection (starting a goroutine per request would allocate). An idle
// watcher parks on its channel; one idle for longer than idleTimeout
// exits (a sweep from a timer, armed only while watchers are idle), so
// the pool shrinks back after a burst. Shutdown ends them all.
//
// Bound: a watcher rejoins the idle list before it signals its connection
// that it is done, so a connection never starts its next watch while its
// previous watcher is still on its way back. The number of watcher
// goroutines is therefore at most the peak number of connections watched
// at once (each connection has at most one watcher running), which is at
// most the peak number of open connections.
type watchers struct {
	mu sync.Mutex
	// idle is a stack: watchers are taken from the top, so the bottom
	// ones have been idle longest and the sweep removes from the bottom.
	idle        []idleWatcher
	closed      bool
	starts      atomic.Uint64 // watches started (Stats.WatchStarts)
	started     int           // watcher goroutines started (tests)
	exited      int           // watcher goroutines ended by the idle sweep (tests)
	timer       *time.Timer
	idleTimeout time.Duration
	onShrink    func() // called, without mu held, after a sweep ended watchers
}

type idleWatcher struct {
	ch    chan *conn
	since time.Time
}

// DefaultWatcherIdleTimeout is how long an idle client-abort watcher
// goroutine waits for work before it exits.
const DefaultWatcherIdleTimeout = 10 * time.Second

func (w *watchers) start(c *conn) {
	w.starts.Add(1)
	w.mu.Lock()
	if n := len(w.idle); n > 0 {
		ch := w.idle[n-1].ch
		w.idle[n-1] = idleWatcher{}
		w.idle = w.idle[:n-1]
		w.mu.Unlock()
		ch <- c
		return
	}
	w.started++
	if w.idleTimeout == 0 {
		w.idleTimeout = durOr(c.p.cfg.Load().watcherIdle, DefaultWatcherIdleTimeout)
	}
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
			w.idle = append(w.idle, idleWatcher{ch, time.Now()}) // before the signal: see watchers
			if w.timer == nil {
				w.timer = time.AfterFunc(w.idleTimeout, w.sweep)
			}
		}
		w.mu.Unlock()
		c.watchDone <- struct{}{} // c is not touched after this
		if closed {
			return
		}
	}
}

// sweep ends the watchers idle for idleTimeout or longer and re-arms the
// timer for the oldest remaining one.
func (w *watchers) sweep() {
	if w.sweepLocked() > 0 && w.onShrink != nil {
		w.onShrink() // without w.mu: it takes Proxy.mu, then w.mu
	}
}

// sweepLocked does sweep's work under w.mu and returns the number of
// watchers it ended.
func (w *watchers) sweepLocked() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.timer = nil
	if w.closed {
		return 0
	}
	now := time.Now()
	k := 0
	for k < len(w.idle) && now.Sub(w.idle[k].since) >= w.idleTimeout {
		close(w.idle[k].ch) // its loop ends
		k++
	}
	w.exited += k
	n := copy(w.idle, w.idle[k:])
	clear(w.idle[n:])
	w.idle = w.idle[:n]
	if n > 0 {
		w.timer = time.AfterFunc(w.idleTimeout-now.Sub(w.idle[0].since), w.sweep)
	}
	if cap(w.idle) > 64 && n < cap(w.idle)/4 {
		w.idle = append([]idleWatcher(nil), w.idle...) // give the burst's array back
	}
	return k
}

func (w *watchers) close() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.closed = true
	if w.timer != nil {
		w.timer.Stop()
		w.timer = nil
	}
	for _, iw := range w.idle {
		close(iw.ch)
	}
	w.idle = nil
}

// count returns the watcher goroutines alive (running or idle).
func (w *watchers) count() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.started - w.exited
}
