package rlserver

import (
	"errors"
	"sync"
	"time"
)

// Driven mode (Config.Driven): the server starts no worker goroutine; an
// owner, typically an event loop, watches each socket's descriptor and
// calls Serve when it turns readable, on whatever thread it runs. The
// datagrams, the wire codec, the state and the answers (batched, with
// UDP_SEGMENT) are the same as a worker's; only who waits differs. Each
// Serve reads with recvmmsg(MSG_DONTWAIT), decides and answers at once
// with sendmmsg, and never waits: a full send buffer drops the rest of
// that turn's answers (counted as send errors; the client retries, as
// for any lost datagram).
//
// A socket's datagrams queue in the kernel until an owner attaches: none
// is lost between Start and Attach. An owner that detaches before Close
// (an event loop stopping while clients still ask: HTTP/2 connections
// draining after the loops) hands the socket back to the server, which
// serves it from then on with a worker goroutine, as in worker mode. The package does not import the event
// loop; pkg/embedded adapts a Socket to pkg/evloop.

// ErrAttached is returned by Attach for a socket that already has an owner.
var ErrAttached = errors.New("rlserver: socket already attached")

// ErrClosed is returned by Attach after Close.
var ErrClosed = errors.New("rlserver: server closed")

// Socket is one socket of a driven server's SO_REUSEPORT group.
//
// Lifecycle: Attach, then Serve on readiness (from one goroutine or
// thread at a time), then Detach. Close does not close the descriptor of
// an attached socket under its owner: it marks it, and Detach answers
// what is still queued (bounded) and closes it. A socket never attached is
// drained and closed by Close.
type Socket struct {
	w  *worker
	mu sync.Mutex // Serve vs Attach/Detach/Close; uncontended on the serving path
	// owned: attached and not detached; closed: the descriptor is closed;
	// closing: the server is closing (an owner's Detach closes); worker:
	// handed to a worker goroutine after its owner detached.
	owned, closed, closing, worker bool
}

// Sockets returns the sockets of a driven server (nil in worker mode), in
// the order of their workers: socket i is Stats' worker i.
func (s *Server) Sockets() []*Socket { return s.sockets }

// FD is the socket's descriptor, to watch for readability. It stays open
// until Detach (or Close, for a socket never attached); the owner must not
// close it.
func (k *Socket) FD() int { return k.w.bc.fd }

// ID is the socket's index in Sockets.
func (k *Socket) ID() int { return k.w.id }

// Attach makes the caller the socket's owner. It fails for a socket
// already owned or after Close.
func (k *Socket) Attach() error {
	k.mu.Lock()
	defer k.mu.Unlock()
	switch {
	case k.closed || k.closing:
		return ErrClosed
	case k.owned || k.worker:
		return ErrAttached
	}
	k.owned = true
	return nil
}

// Detach ends the ownership; the owner must have stopped watching FD.
// After the server's Close it answers what is queued (bounded) and closes
// the descriptor; before, a worker goroutine serves the socket from now
// on (Close stops it). Idempotent.
func (k *Socket) Detach() {
	k.mu.Lock()
	defer k.mu.Unlock()
	if !k.owned {
		return
	}
	k.owned = false
	if k.closing {
		k.closeLocked()
		return
	}
	s := k.w.s
	if err := k.w.bc.toNetpoller(); err != nil {
		// Only descriptor exhaustion gets here; the socket is closed.
		s.log.Error("ratelimitly server: a detached socket got no worker and is closed", "socket", k.w.id, "err", err)
		return
	}
	k.worker = true
	s.wg.Add(1)
	go k.w.run()
}

// serverClosed is Close's first part: mark the socket and stop its worker,
// if any (Close then waits for the workers and calls closeIfFree).
func (k *Socket) serverClosed() {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.closing = true
	if k.worker {
		_ = k.w.bc.conn.SetReadDeadline(time.Unix(1, 0))
		_ = k.w.bc.conn.SetWriteDeadline(time.Now().Add(time.Second))
	}
}

// closeIfFree is Close's second part: close now unless an owner serves
// the socket (its Detach closes it).
func (k *Socket) closeIfFree() {
	k.mu.Lock()
	defer k.mu.Unlock()
	if !k.owned {
		k.closeLocked()
	}
}

func (k *Socket) closeLocked() {
	if k.closed {
		return
	}
	k.w.drain()
	k.w.bc.close()
	k.closed = true
}

// Serve reads, decides and answers the datagrams queued on the socket
// without waiting: read turns of up to Config.Batch messages until
// maxTurns × Config.Batch datagrams were served (maxTurns < 1 counts as
// 1; a message coalesced by UDP_GRO holds up to 64 datagrams and one read
// may overshoot the bound by that much), each turn answered in one send
// batch. It stops early when a read comes back short (the queue is empty;
// a datagram arriving later makes the socket readable again). It reports
// more = true when it stopped at the bound with datagrams possibly still
// queued: an edge-triggered owner must call it again (after serving its
// other work: that is the point of the bound), since no new readiness
// event may come for them.
//
// Serve does not allocate in steady state. Call it from one thread at a
// time; it does nothing on a closed socket.
func (k *Socket) Serve(maxTurns int) (more bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.closed || !k.owned {
		return false
	}
	w := k.w
	// The bound counts datagrams, not messages: a message coalesced by
	// UDP_GRO holds up to 64 (one read can still bring MaxBatch such
	// messages: the bound is checked between reads).
	budget := max(maxTurns, 1) * w.batch
	for budget > 0 {
		n, err := w.bc.recvNow(w.batch)
		if err != nil {
			w.inc(cReadErrors)
			return false
		}
		if n == 0 {
			return false
		}
		d := w.datagrams(n)
		w.noteTurn(d)
		w.turn(n)
		if n < w.batch {
			return false // a short read: the queue is empty
		}
		budget -= d
	}
	return true
}
