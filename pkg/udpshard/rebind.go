// Source-port rebinds and the retirement of replaced sockets (see the
// package doc's rebind protocol).

package udpshard

import "time"

func (s *shard) maybeRebind() {
	s.mu.Lock()
	pending := s.rebindPending
	s.mu.Unlock()
	if !pending || s.r.closed.Load() {
		return
	}
	if gap := s.r.cfg.RebindMinInterval; gap > 0 && !s.lastRebind.IsZero() {
		if wait := gap - time.Since(s.lastRebind); wait > 0 {
			s.retry.Reset(wait)
			return
		}
	}
	sock, err := s.r.open(s)
	if err != nil {
		s.c.rebindFailures.Add(1)
		if s.backoff == 0 {
			s.backoff = s.r.cfg.RebindBackoffMin
		} else if s.backoff *= 2; s.backoff > s.r.cfg.RebindBackoffMax {
			s.backoff = s.r.cfg.RebindBackoffMax
		}
		s.r.log.Warn("udpshard: rebind failed, keeping current socket", "shard", s.idx, "retry_in", s.backoff, "err", err)
		s.retry.Reset(s.backoff)
		return
	}
	s.backoff = 0
	s.lastRebind = time.Now()
	s.mu.Lock()
	old := s.cur
	s.cur = sock
	s.old = append(s.old, old)
	s.rebindPending = false
	s.mu.Unlock()
	s.c.rebinds.Add(1)
	if s.own.owned {
		s.ownerWatch(sock)
	}
	s.r.log.Debug("udpshard: rebound", "shard", s.idx, "from", old.local, "to", sock.local)
}

// retire closes switched-out sockets that nobody holds and no queued
// datagram targets. It runs only on the shard loop, never on a read path.
func (s *shard) retire() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.old) == 0 {
		return
	}
	if s.flushing { // a flusher may be sending on an old socket
		s.retireWanted = true
		return
	}
	keep := s.old[:0]
	for _, o := range s.old {
		if o.refs.Load() == 0 && !s.queuedForLocked(o) {
			s.closeSocketLocked(o)
			s.c.retired.Add(1)
			continue
		}
		keep = append(keep, o)
	}
	for i := len(keep); i < len(s.old); i++ {
		s.old[i] = nil
	}
	s.old = keep
}

func (s *shard) queuedForLocked(o *Socket) bool {
	for i := 0; i < s.qn; i++ {
		if s.q[i].sock == o {
			return true
		}
	}
	return false
}

func (s *shard) closeSocketLocked(o *Socket) {
	if o.closed {
		return
	}
	o.closed = true
	if o.watched {
		s.closeWatchedLocked(o) // the owner closes it once unwatched
		return
	}
	o.file.Close() // wakes the reader, which then exits
}
