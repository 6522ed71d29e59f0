package embedded

import (
	"fmt"
	"sync"
	"time"

	"github.com/rl-tproxy/rl-tproxy/pkg/evloop"
	"github.com/rl-tproxy/rl-tproxy/pkg/rlserver"
)

// ServeTurns bounds one wake-up of a server socket on its loop: at most
// this many read batches (of up to rlserver.MaxBatch datagrams) before the
// loop turns to its other sockets; the rest is served in the next turn.
const ServeTurns = 4

// detachWait bounds how long Close waits for a loop to detach its socket
// (a loop that stopped without detaching never runs the request).
const detachWait = 2 * time.Second

// LoopAttacher serves the sockets of a loop-driven embedded server
// (Config.Loops) on event loops: socket i on the loop with ID i. It is a
// proxy.LoopAttacher (give it to Proxy.Attach); it works with any
// pkg/evloop loops.
type LoopAttacher struct {
	e     *Embedded
	mu    sync.Mutex
	socks []*loopSock
}

// loopSock is one server socket on its loop. Every field but done is
// used on the loop's thread only.
type loopSock struct {
	k       *rlserver.Socket
	l       *evloop.Loop
	w       *evloop.Watch
	more    evloop.Timer // serves the rest after a bounded wake-up
	serveFn func()
	// drainedAt is the loop's Now when a Serve last found the queue
	// empty: a second readiness event from the same poll (io_uring may
	// post one per wake-up) needs no read.
	drainedAt int64
	detached  bool
	done      chan struct{} // closed by detach
}

// LoopAttacher returns the attacher of a loop-driven server, nil when
// Config.Loops was 0.
func (e *Embedded) LoopAttacher() *LoopAttacher { return e.att }

// AttachLoop starts serving server socket l.ID() on l (on l's thread).
// Datagrams queued before are served at once. A loop whose ID has no
// socket serves none. The returned detach stops it (on l's thread).
func (a *LoopAttacher) AttachLoop(l *evloop.Loop) (detach func(), err error) {
	socks := a.e.Server.Sockets()
	id := l.ID()
	if id >= len(socks) {
		return nil, nil
	}
	k := socks[id]
	if err := k.Attach(); err != nil {
		return nil, fmt.Errorf("embedded ratelimitly: socket %d: %w", id, err)
	}
	ls := &loopSock{k: k, l: l, drainedAt: -1, done: make(chan struct{})}
	ls.serveFn = ls.serve
	ls.more.Init(l, ls.serveFn)
	ls.w, err = l.Watch(k.FD(), ls.onReadable)
	if err != nil {
		k.Detach()
		return nil, fmt.Errorf("embedded ratelimitly: socket %d: %w", id, err)
	}
	a.mu.Lock()
	a.socks = append(a.socks, ls)
	a.mu.Unlock()
	ls.serve()
	return ls.detach, nil
}

func (ls *loopSock) onReadable() {
	if ls.drainedAt == ls.l.Now() || ls.more.Armed() {
		return // drained this turn, or the timer serves the rest next turn
	}
	ls.serve()
}

func (ls *loopSock) serve() {
	if ls.detached {
		return
	}
	if ls.k.Serve(ServeTurns) {
		ls.drainedAt = -1
		// The rest in the next turn, after the loop's other work: due
		// after this turn's clock (at Now it would fire again in this
		// turn's timer run, once per armed timer of the loop).
		ls.more.Reset(ls.l.Now() + 1)
		return
	}
	ls.drainedAt = ls.l.Now()
}

// detach stops watching and gives the socket back to the server
// (idempotent; loop thread).
func (ls *loopSock) detach() {
	if ls.detached {
		return
	}
	ls.detached = true
	ls.w.Stop()
	ls.more.Stop()
	ls.k.Detach()
	close(ls.done)
}

// detachAll detaches every attached socket on its loop and waits
// (bounded) for it. Not from a loop thread.
func (a *LoopAttacher) detachAll() {
	a.mu.Lock()
	socks := a.socks
	a.socks = nil
	a.mu.Unlock()
	for _, ls := range socks {
		ls.l.Post(ls.detach)
	}
	if len(socks) == 0 {
		return
	}
	t := time.NewTimer(detachWait)
	defer t.Stop()
	for _, ls := range socks {
		select {
		case <-ls.done:
		case <-t.C:
			a.e.log.Warn("embedded ratelimitly: an event loop did not detach its server socket; closing without it",
				"socket", ls.k.ID())
			return
		}
	}
}
