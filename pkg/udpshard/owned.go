// Owned shards: a shard whose sockets are read by an owner's thread (an
// event loop) instead of reader goroutines (see the package doc).

package udpshard

import (
	"errors"
	"fmt"

	"golang.org/x/sys/unix"
)

// Owner is the thread that reads an owned shard: an event loop, seen
// through the two calls a shard needs (udpshard knows no loop package).
type Owner interface {
	// Watch calls onReadable on the owner's thread whenever fd may have
	// become readable, until stop is called (on the owner's thread). It
	// is called on the owner's thread.
	Watch(fd int, onReadable func()) (stop func(), err error)
	// Post runs fn on the owner's thread later; any goroutine.
	Post(fn func())
}

// maxOwnedTurns bounds one onReadable call per socket to maxOwnedTurns ×
// MaxBatch datagrams (read turns of MaxBatch messages, a message
// coalesced by UDP_GRO counting its datagrams):
// with more queued the read goes on in a later turn of the owner (Post),
// so that a flood cannot hold the owner's other work back.
const maxOwnedTurns = 8

// ownState is the owner side of an owned shard (Config.Owned).
type ownState struct {
	owned bool    // the shard is in owned mode (no reader goroutines)
	owner Owner   // guarded by shard.mu; nil while nobody owns the shard
	h     Handler // the owner's handler; written and read on the owner's thread
	// dying: closed sockets still watched by the owner; the owner stops
	// their watch and closes them (reap). Guarded by shard.mu.
	dying      []*Socket
	reapPosted bool // guarded by shard.mu
	reapFn     func()
	// bs are the receive buffers of the owner's reads (one set per
	// receive mode; owner's thread only), given back at release.
	bs [2]*rxBatch
}

// ErrNotOwned is returned by Own for a shard that is not in owned mode.
var ErrNotOwned = errors.New("udpshard: shard not in owned mode (Config.Owned)")

// Own makes o the owner of shard, which must be in owned mode
// (Config.Owned); it is called on o's thread. The shard's sockets (the
// current one and switched-out ones that still receive late answers,
// and those a later Rebind opens) are then read on o's thread: when one
// turns readable, recvmmsg runs until it is empty and every datagram
// goes to h there, with no goroutine involved. Datagrams queued on the
// shard are sent when the owner calls FlushOwned (at the end of its
// turn). release, called on o's thread, stops the watches and closes
// the sockets Close or a retirement left to the owner; the owner must
// call it before its thread goes away.
func (r *Ring) Own(shard int, o Owner, h Handler) (release func(), err error) {
	if shard < 0 || shard >= len(r.shards) {
		return nil, fmt.Errorf("udpshard: own shard %d of %d", shard, len(r.shards))
	}
	if o == nil || h == nil {
		return nil, errors.New("udpshard: own: owner and handler are required")
	}
	s := r.shards[shard]
	if !s.own.owned {
		return nil, fmt.Errorf("udpshard: own shard %d: %w", shard, ErrNotOwned)
	}
	s.mu.Lock()
	if r.closed.Load() {
		s.mu.Unlock()
		return nil, ErrClosed
	}
	if s.own.owner != nil {
		s.mu.Unlock()
		return nil, fmt.Errorf("udpshard: shard %d already has an owner", shard)
	}
	s.own.owner, s.own.h = o, h
	socks := make([]*Socket, 0, 1+len(s.old))
	if s.cur != nil && !s.cur.closed {
		socks = append(socks, s.cur)
	}
	for _, so := range s.old {
		if !so.closed {
			socks = append(socks, so)
		}
	}
	s.mu.Unlock()
	for _, so := range socks {
		if err := s.watch(so); err != nil {
			s.release()
			return nil, fmt.Errorf("udpshard: own shard %d: %w", shard, err)
		}
	}
	return s.release, nil
}

// FlushOwned sends the owned shard's queued datagrams from the owner's
// thread, the whole turn's worth in sendmmsg batches (one UDP_SEGMENT
// message per endpoint), unless another goroutine is flushing the shard
// (it then sends them). It never waits: when the socket's send buffer is
// full (EAGAIN, ENOBUFS) it stops and reports blocked, and the datagrams
// it could not send stay queued, in order, ahead of those queued later:
// backpressure, not a failure. The owner calls it again in a later turn
// (a full buffer drains at the link's pace, so soon, not at once). The
// queue (Config.QueueLen) bounds what waits: a Push into a full queue is
// refused (ErrQueueFull, counted), so a socket that stays blocked ends in
// counted send failures, never in unbounded memory.
func (r *Ring) FlushOwned(shard int) (blocked bool) { return r.shards[shard].flushMode(true) }

// Owned reports whether shard has an owner now.
func (r *Ring) Owned(shard int) bool {
	s := r.shards[shard]
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.own.owner != nil
}

// watch registers so with the shard's owner and reads what is already
// queued on it; owner's thread. A socket closed meanwhile, or a shard
// released, is left alone.
func (s *shard) watch(so *Socket) error {
	s.mu.Lock()
	o := s.own.owner
	if o == nil || so.closed || so.watched {
		s.mu.Unlock()
		return nil
	}
	// Marked before the Watch call, so that a rebind retiring so
	// meanwhile leaves its close to the owner (reap, which runs on this
	// thread after us) instead of closing an fd this thread is about to
	// register (its number could be reused by then).
	so.watched = true
	s.mu.Unlock()
	stop, err := o.Watch(so.fd, so.rd.ownedFn)
	s.mu.Lock()
	if err != nil {
		if !so.closed {
			so.watched = false
		} // else it is dying: reap closes it
		s.mu.Unlock()
		return fmt.Errorf("watch socket %s: %w", so.local, err)
	}
	so.stop = stop
	s.mu.Unlock()
	so.rd.ownedRead() // datagrams that arrived before the watch
	return nil
}

// ownerWatch hands a socket a rebind opened to the shard's owner; shard
// loop goroutine.
func (s *shard) ownerWatch(so *Socket) {
	s.mu.Lock()
	o := s.own.owner
	s.mu.Unlock()
	if o != nil {
		o.Post(func() {
			if err := s.watch(so); err != nil {
				s.r.log.Error("udpshard: owned socket not watched: its datagrams are read only by Drain",
					"shard", s.idx, "err", err)
			}
		})
	}
}

// closeWatchedLocked closes a socket the owner watches: the owner stops
// the watch and closes it on its thread (reap). s.mu is held.
func (s *shard) closeWatchedLocked(so *Socket) {
	s.own.dying = append(s.own.dying, so)
	if !s.own.reapPosted {
		s.own.reapPosted = true
		s.own.owner.Post(s.own.reapFn)
	}
}

// reap stops the watch of the dying sockets and closes them; owner's
// thread.
func (s *shard) reap() {
	s.mu.Lock()
	dying := s.own.dying
	s.own.dying = nil
	s.own.reapPosted = false
	for _, so := range dying {
		so.watched = false
	}
	s.mu.Unlock()
	for _, so := range dying {
		if so.stop != nil {
			so.stop()
			so.stop = nil
		}
		so.file.Close()
	}
}

// release ends the ownership: every watch stops, the sockets that were
// closed meanwhile are closed for good, the owner's buffers go back;
// owner's thread. Idempotent.
func (s *shard) release() {
	s.mu.Lock()
	if s.own.owner == nil {
		s.mu.Unlock()
		return
	}
	s.own.owner = nil
	var stops []func()
	for _, so := range append([]*Socket{s.cur}, s.old...) {
		if so != nil && so.watched {
			so.watched = false
			stops = append(stops, so.stop)
			so.stop = nil
		}
	}
	s.mu.Unlock()
	for _, stop := range stops {
		stop()
	}
	s.reap()
	s.own.h = nil
	for i, b := range s.own.bs {
		if b != nil {
			b.release()
			s.own.bs[i] = nil
		}
	}
}

// ownedEdge is the owner's Watch callback: it reads, unless a
// continuation is already posted (that one reads in its turn).
func (rd *reader) ownedEdge() {
	if !rd.contPosted {
		rd.ownedRead()
	}
}

// ownedCont is a posted continuation of ownedRead.
func (rd *reader) ownedCont() {
	rd.contPosted = false
	rd.ownedRead()
}

// ownedRead reads so until it is empty (at most maxOwnedTurns read
// turns, then it goes on in a later turn of the owner, one continuation
// at a time) and hands every datagram to the owner's handler; owner's
// thread.
func (rd *reader) ownedRead() {
	so := rd.sock
	s := so.sh
	h := s.own.h
	if h == nil || s.r.closed.Load() {
		return // released (a stale continuation), or the ring closed
	}
	mode := 0
	if so.gro {
		mode = 1
	}
	b := s.own.bs[mode]
	if b == nil {
		nb, err := newRxBatch(so.gro)
		if err != nil {
			s.c.recvErr.Add(1)
			return
		}
		b, s.own.bs[mode] = nb, nb
	}
	rd.b = b
	// The bound counts datagrams: with UDP_GRO one message holds up to 64.
	for budget := maxOwnedTurns * MaxBatch; budget > 0; {
		rd.turn.Lock() // Drain's barrier
		rd.fetched = false
		if so.rc.Control(rd.ctlFn) != nil || !rd.fetched {
			rd.turn.Unlock()
			return // closed, or empty
		}
		full := b.deliver(so, h)
		again := full || b.err != 0 && b.err != unix.EBADF
		budget -= max(b.delivered, 1)
		rd.turn.Unlock()
		if !again {
			return
		}
	}
	s.mu.Lock()
	o := s.own.owner
	s.mu.Unlock()
	if o != nil && !rd.contPosted {
		rd.contPosted = true
		o.Post(rd.contFn)
	}
}
