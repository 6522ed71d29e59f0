// The send path of a shard: queueing, the shard loop, and flat-combined
// sendmmsg with UDP GSO grouping (see the package doc).

package udpshard

import (
	"net/netip"
	"runtime"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

type sendErr struct {
	token uint64
	err   syscall.Errno
}

// msgGroup describes one sendmmsg message of a run: one datagram, or
// several to the same destination sent with UDP_SEGMENT.
type msgGroup struct {
	to    netip.AddrPort
	seg   int  // segment size (the first datagram's length)
	cnt   int  // datagrams
	bytes int  // payload bytes
	open  bool // may take another datagram (all so far have size seg)
	iov   int  // first iovec
	fill  int  // iovecs placed so far (layout)
}

const (
	// gsoMaxSegments bounds the datagrams of one segmented message (the
	// kernel's UDP_MAX_SEGMENTS is 64 on older kernels).
	gsoMaxSegments = 64
	// gsoMaxSegSize: larger datagrams are sent alone. A segment must fit
	// the path MTU whole (the kernel refuses to fragment it), so only
	// datagrams that fit the IPv6 minimum MTU are grouped.
	gsoMaxSegSize = 1200
	// gsoMaxBytes bounds the payload of one segmented message (it is one
	// IP packet until it is segmented).
	gsoMaxBytes = 60000
	// gsoScan is how many of the latest messages a datagram may join.
	gsoScan = 8
	// gsoCmsgSpace is the control buffer of one message: a UDP_SEGMENT
	// cmsg with a uint16.
	gsoCmsgSpace = (unix.SizeofCmsghdr + 2 + 7) &^ 7
)

type sendSlot struct {
	sock  *Socket
	to    netip.AddrPort
	token uint64
	n     int
	keep  bool // a full send buffer refused it: back to the queue (flusher-owned)
	buf   [MaxPayload]byte
}

func (s *shard) kick() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

func (s *shard) enqueue(sock *Socket, to netip.AddrPort, pkt []byte, token uint64) error {
	if len(pkt) > MaxPayload {
		s.c.tooLarge.Add(1)
		return ErrTooLarge
	}
	s.mu.Lock()
	if s.r.closed.Load() {
		s.mu.Unlock()
		s.c.closed.Add(1)
		return ErrClosed
	}
	if sock == nil {
		sock = s.cur
	}
	if !reachable(sock, to) {
		s.mu.Unlock()
		s.c.family.Add(1)
		return ErrFamily
	}
	if s.qn == len(s.q) {
		s.mu.Unlock()
		s.c.queueFull.Add(1)
		return ErrQueueFull
	}
	sl := &s.q[s.qn]
	s.qn++
	sl.sock = sock
	sl.to = to
	sl.token = token
	sl.n = copy(sl.buf[:], pkt)
	s.mu.Unlock()
	return nil
}

func reachable(sock *Socket, to netip.AddrPort) bool {
	a := to.Addr()
	if !a.IsValid() || to.Port() == 0 {
		return false
	}
	if sock.fam == unix.AF_INET {
		return a.Unmap().Is4()
	}
	return sock.dual || !a.Unmap().Is4()
}

// loop is the shard's event loop: flush, rebind, retire.
func (s *shard) loop() {
	defer s.r.wg.Done()
	s.retry = time.NewTimer(time.Hour)
	s.retry.Stop()
	defer s.retry.Stop()
	for {
		select {
		case <-s.r.done:
			s.dropQueued()
			return
		case <-s.fwake:
			s.c.flushWakes.Add(1)
			s.coalesce()
			s.fkicked.Store(false) // later FlushAsync calls wake us again
			s.flush()
			if !s.hasLoopWork() {
				continue
			}
		case <-s.wake:
		case <-s.retry.C:
		}
		s.c.loopWakes.Add(1)
		s.flush()
		s.deliverErrors()
		s.maybeRebind()
		s.retire()
	}
}

// maxCoalesceYields bounds the yields of one coalescing round.
const maxCoalesceYields = 4

// coalesce gives the goroutines that are runnable now the chance to queue
// their datagrams before the loop sends: it yields the processor while the
// queue keeps growing, at most maxCoalesceYields times and never once it
// holds MaxBatch datagrams. On an idle machine the first yield returns at
// once and finds nothing new.
func (s *shard) coalesce() {
	n := s.queued()
	for i := 0; i < maxCoalesceYields && n < MaxBatch; i++ {
		runtime.Gosched()
		s.c.flushYields.Add(1)
		m := s.queued()
		if m == n {
			return
		}
		n = m
	}
}

// queued is the number of datagrams waiting in the queue.
func (s *shard) queued() int {
	s.mu.Lock()
	n := s.qn
	s.mu.Unlock()
	return n
}

// hasLoopWork reports whether errors await delivery or switched-out
// sockets await retirement, so that the flush path goes on with a full
// loop turn. A pending rebind is not loop work here: Rebind wakes the
// loop itself, and a rebind deferred by RebindMinInterval or a backoff
// has the retry timer armed.
func (s *shard) hasLoopWork() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.errs) > 0 || len(s.old) > 0
}

func (s *shard) dropQueued() {
	s.mu.Lock()
	n := s.qn
	for i := 0; i < n; i++ {
		s.q[i].sock = nil
	}
	s.qn = 0
	s.mu.Unlock()
	s.c.closed.Add(uint64(n))
}

// flush sends everything queued, in sendmmsg batches of consecutive
// datagrams for the same socket. Only one goroutine flushes a shard at a
// time; a concurrent caller returns at once and its datagrams go out in the
// active flusher's next round.
func (s *shard) flush() { s.flushMode(false) }

// flushMode is flush; nowait: never park on a full send buffer (the
// owner's thread, FlushOwned). It reports whether a full send buffer
// stopped it (nowait only): the datagrams it could not send are queued
// again, ahead of the others.
func (s *shard) flushMode(nowait bool) (blocked bool) {
	s.mu.Lock()
	if s.flushing {
		s.mu.Unlock()
		return false
	}
	s.flushing = true
	s.nowait = nowait
	for {
		n := s.qn
		if n == 0 || blocked {
			s.flushing = false
			wake := s.retireWanted || len(s.errs) > 0
			s.retireWanted = false
			s.mu.Unlock()
			if wake {
				s.kick() // retire / error delivery happen on the loop
			}
			return blocked
		}
		batch := s.q
		s.q, s.spare = s.spare, batch
		s.qn = 0
		s.mu.Unlock()
		s.blocked = false
		stop := s.sendSlots(batch[:n])
		s.mu.Lock()
		if s.blocked {
			blocked = true
			s.requeueLocked(batch, n, stop)
			continue
		}
		for i := range batch[:n] {
			batch[i].sock = nil
		}
	}
}

// requeueLocked puts the datagrams of batch[:n] that a full send buffer
// left unsent (marked keep, and every one from stop on) back at the head
// of the queue, in their order, ahead of the datagrams queued during the
// flush; batch becomes the queue. What does not fit (the newest) is
// refused: counted as QueueFull and reported to OnSendError (EAGAIN), as
// a Push into a full queue is refused. s.mu held; flusher only.
func (s *shard) requeueLocked(batch []sendSlot, n, stop int) {
	w := 0
	for k := range n {
		sl := &batch[k]
		if k < stop && !sl.keep {
			continue
		}
		sl.keep = false
		if w != k {
			batch[w] = *sl
		}
		w++
	}
	s.c.sendBlocked.Add(1)
	s.c.requeued.Add(uint64(w))
	for k := range s.qn { // queued during the flush: after the kept ones
		sl := &s.q[k]
		if w < len(batch) {
			batch[w] = *sl
			w++
		} else {
			s.c.queueFull.Add(1)
			if s.r.cfg.OnSendError != nil && len(s.errs) < cap(s.errs) {
				s.errs = append(s.errs, sendErr{token: sl.token, err: unix.EAGAIN})
			}
		}
		sl.sock = nil
	}
	for k := w; k < n; k++ {
		batch[k].sock = nil
	}
	s.q, s.spare = batch, s.q
	s.qn = w
}

// deliverErrors runs OnSendError for refused datagrams (loop goroutine).
func (s *shard) deliverErrors() {
	s.mu.Lock()
	s.errTmp = append(s.errTmp[:0], s.errs...)
	s.errs = s.errs[:0]
	s.mu.Unlock()
	if cb := s.r.cfg.OnSendError; cb != nil {
		for _, e := range s.errTmp {
			cb(e.token, e.err)
		}
	}
}

// sendSlots sends slots in runs of consecutive datagrams for the same
// socket, at most MaxBatch per run. When a full send buffer stops a run
// (s.blocked, nowait only) it returns the end of that run: the run's
// unsent datagrams are marked keep, and none after it was tried.
func (s *shard) sendSlots(slots []sendSlot) (stop int) {
	for i := 0; i < len(slots); {
		sock := slots[i].sock
		j := i + 1
		for j < len(slots) && slots[j].sock == sock && j-i < MaxBatch {
			j++
		}
		s.sendRun(sock, slots[i:j])
		if s.blocked {
			return j
		}
		i = j
	}
	return len(slots)
}

// sendRun sends up to MaxBatch datagrams that all go out through sock. It
// packs them into sendmmsg messages (buildMsgs) and, if the kernel
// refuses segmentation offload, sends what is left again without it.
func (s *shard) sendRun(sock *Socket, slots []sendSlot) {
	n := len(slots)
	for e := range n {
		s.ent[e] = e
	}
	for n > 0 {
		nm := s.buildMsgs(sock, slots, n)
		failed := s.sendMsgs(sock, slots, nm)
		if failed < 0 {
			return
		}
		if s.blocked {
			// Messages from failed on were not sent: their datagrams go
			// back to the queue. Those of one destination are in queue
			// order across the messages, so the sent ones are the oldest.
			for e := range n {
				if s.entMsg[e] >= failed {
					slots[s.ent[e]].keep = true
				}
			}
			return
		}
		// Messages before failed went out; resend the datagrams of the
		// others one by one (sock.noGSO is now set).
		k := 0
		for e := range n {
			if s.entMsg[e] >= failed {
				s.ent[k] = s.ent[e]
				k++
			}
		}
		n = k
	}
}

// buildMsgs fills s.msgs with the datagrams slots[s.ent[0:n]] and returns
// the number of messages. Unless segmentation offload is off, datagrams to
// the same destination share one message sent with UDP_SEGMENT (GSO): the
// kernel splits its payload into datagrams of the first one's size (all
// but the last must have exactly that size), so the network stack is
// traversed once per message rather than once per datagram. The iovecs of
// one message point at the slots' buffers (no copy).
func (s *shard) buildMsgs(sock *Socket, slots []sendSlot, n int) int {
	gso := !s.r.cfg.DisableGSO && !sock.noGSO.Load()
	nm := 0
	for e := range n {
		sl := &slots[s.ent[e]]
		m := -1
		if gso && sl.n > 0 && sl.n <= gsoMaxSegSize {
			for k := nm - 1; k >= 0 && k >= nm-gsoScan; k-- {
				g := &s.mg[k]
				if g.open && g.to == sl.to && sl.n <= g.seg && g.cnt < gsoMaxSegments && g.bytes+sl.n <= gsoMaxBytes {
					m = k
					break
				}
			}
		}
		if m < 0 {
			nl := putSockaddr(&s.names[nm], sock.fam, sock.dual, sl.to)
			if nl == 0 { // checked at enqueue; defensive
				s.c.family.Add(1)
				s.entMsg[e] = -1
				continue
			}
			m = nm
			nm++
			s.msgs[m].Hdr.Namelen = nl
			s.mg[m] = msgGroup{to: sl.to, seg: sl.n, open: gso && sl.n > 0 && sl.n <= gsoMaxSegSize}
		}
		g := &s.mg[m]
		s.entMsg[e] = m
		g.cnt++
		g.bytes += sl.n
		if sl.n < g.seg { // a short segment can only be the last one
			g.open = false
		}
	}
	// Lay the iovecs of each message out contiguously, in queue order.
	base := 0
	for m := range nm {
		g := &s.mg[m]
		g.iov, g.fill = base, 0
		base += g.cnt
	}
	for e := range n {
		m := s.entMsg[e]
		if m < 0 {
			continue
		}
		g := &s.mg[m]
		k := g.iov + g.fill
		g.fill++
		sl := &slots[s.ent[e]]
		s.iov[k].Base = &sl.buf[0]
		s.iov[k].SetLen(sl.n)
		s.iovSlot[k] = s.ent[e]
	}
	for m := range nm {
		g := &s.mg[m]
		h := &s.msgs[m].Hdr
		h.Iov = &s.iov[g.iov]
		h.SetIovlen(g.cnt)
		if g.cnt > 1 {
			c := &s.ctrl[m]
			cm := (*unix.Cmsghdr)(unsafe.Pointer(&c[0]))
			cm.Level = unix.SOL_UDP
			cm.Type = unix.UDP_SEGMENT
			cm.SetLen(unix.CmsgLen(2))
			*(*uint16)(unsafe.Pointer(&c[unix.CmsgLen(0)])) = uint16(g.seg)
			h.Control = &c[0]
			h.SetControllen(gsoCmsgSpace)
		} else {
			h.Control = nil
			h.SetControllen(0)
		}
	}
	return nm
}

// sendMsgs sends the built messages. It returns -1 when every message was
// handed to the kernel (or refused and accounted for), or the index of
// a segmented message the kernel refused as such: segmentation offload is
// then turned off for sock and the caller resends from there; or, with
// s.blocked set, the index of the first message a full send buffer
// refused (EAGAIN, ENOBUFS) when the flusher must not park: that is
// backpressure, not a failure, and the rest waits in the queue.
func (s *shard) sendMsgs(sock *Socket, slots []sendSlot, nm int) int {
	off := 0
	for off < nm {
		s.wn, s.werr = 0, 0
		s.wbase = off
		s.wcnt = nm
		var err error
		if s.nowait {
			err = sock.rc.Control(s.ctlWriteFn)
		} else {
			err = sock.rc.Write(s.writeFn)
		}
		if err != nil { // socket closed under us
			for m := off; m < nm; m++ {
				s.c.closed.Add(uint64(s.mg[m].cnt))
			}
			return -1
		}
		if s.werr != 0 && s.nowait && (s.werr == unix.EAGAIN || s.werr == unix.ENOBUFS) {
			s.blocked = true
			return off
		}
		if s.werr != 0 {
			g := &s.mg[off]
			if g.cnt > 1 && gsoRefused(s.werr) {
				if !sock.noGSO.Swap(true) {
					s.c.gsoFallbacks.Add(1)
					s.r.log.Info("udpshard: UDP segmentation offload refused, sending datagrams one by one on this socket",
						"shard", s.idx, "local", sock.local, "err", s.werr)
				}
				return off
			}
			s.c.sendErr.Add(uint64(g.cnt))
			if s.r.cfg.OnSendError != nil {
				s.mu.Lock()
				for k := g.iov; k < g.iov+g.cnt && len(s.errs) < cap(s.errs); k++ {
					s.errs = append(s.errs, sendErr{token: slots[s.iovSlot[k]].token, err: s.werr})
				}
				s.mu.Unlock()
			}
			off++
			continue
		}
		var sent, seg uint64
		for m := off; m < off+s.wn; m++ {
			c := uint64(s.mg[m].cnt)
			sent += c
			if c > 1 {
				seg += c
			}
		}
		s.c.sent.Add(sent)
		s.c.gsoSegments.Add(seg)
		s.c.sendBatches.Add(1)
		off += s.wn
	}
	return -1
}

// gsoRefused reports whether a sendmmsg error on a UDP_SEGMENT message
// means the kernel, device or route cannot segment it (no checksum
// offload, an IPsec route, a segment over the path MTU, an old kernel).
func gsoRefused(e syscall.Errno) bool {
	switch e {
	case unix.EIO, unix.EINVAL, unix.EMSGSIZE, unix.ENOPROTOOPT, unix.EOPNOTSUPP:
		return true
	}
	return false
}

// writeNoWait is write for a flusher that must not park: a full send
// buffer ends the flush (EAGAIN; sendMsgs).
func (s *shard) writeNoWait(fd uintptr) {
	if !s.write(fd) {
		s.werr = unix.EAGAIN
	}
}

// write is the RawConn.Write callback (allocated once per shard).
func (s *shard) write(fd uintptr) bool {
	for {
		n, e := sendmmsg(fd, s.msgs[s.wbase:s.wcnt])
		switch e {
		case 0:
			s.wn = n
			return true
		case unix.EINTR:
			continue
		case unix.EAGAIN:
			return false
		default:
			s.werr = e
			return true
		}
	}
}
