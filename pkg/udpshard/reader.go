package udpshard

import (
	"runtime"
	"sync"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// maxDrainTurns bounds the read turns of one Drain call per socket.
const maxDrainTurns = 16

// rxBatch is the receive state of one recvmmsg: up to MaxBatch datagrams.
type rxBatch struct {
	msgs  [MaxBatch]unix.Mmsghdr
	iov   [MaxBatch]unix.Iovec
	names [MaxBatch]unix.RawSockaddrInet6
	bufs  [MaxBatch][recvBufSize]byte
	n     int
	err   syscall.Errno
}

func newRxBatch() *rxBatch {
	b := &rxBatch{}
	for i := range b.msgs {
		b.iov[i].Base = &b.bufs[i][0]
		b.iov[i].SetLen(recvBufSize)
		b.msgs[i].Hdr.Iov = &b.iov[i]
		b.msgs[i].Hdr.SetIovlen(1)
		b.msgs[i].Hdr.Name = (*byte)(unsafe.Pointer(&b.names[i]))
	}
	return b
}

// recv runs one non-blocking recvmmsg into the buffers. It returns false
// when the socket has nothing queued (EAGAIN).
func (b *rxBatch) recv(fd uintptr) bool {
	for i := range b.msgs {
		b.msgs[i].Hdr.Namelen = unix.SizeofSockaddrInet6
		b.msgs[i].Hdr.Flags = 0
		b.msgs[i].Len = 0
	}
	for {
		n, e := recvmmsg(fd, b.msgs[:])
		switch e {
		case 0:
			b.n, b.err = n, 0
			return true
		case unix.EINTR:
			continue
		case unix.EAGAIN:
			b.n, b.err = 0, 0
			return false
		default:
			b.n, b.err = 0, e
			return true
		}
	}
}

// deliver hands the datagrams of the last recv to h and reports whether
// the turn was full.
func (b *rxBatch) deliver(sock *Socket, h Handler) bool {
	s := sock.sh
	if b.err != 0 {
		s.c.recvErr.Add(1)
		return false
	}
	if b.n <= 0 {
		return false
	}
	s.c.recvBatches.Add(1)
	delivered := 0
	for i := 0; i < b.n; i++ {
		m := &b.msgs[i]
		if m.Hdr.Flags&unix.MSG_TRUNC != 0 {
			s.c.truncated.Add(1)
			continue
		}
		delivered++
		h(sock, b.bufs[i][:m.Len], getSockaddr(&b.names[i]))
	}
	s.c.received.Add(uint64(delivered))
	return b.n == MaxBatch
}

// reader receives datagrams for one socket with recvmmsg, at most MaxBatch
// per read turn.
//
// A read turn (one recvmmsg and the delivery of what it returned) runs
// under turn, so that Drain can wait for a turn in progress to be
// delivered. The reader takes turn inside the RawConn callback (never
// while parked) and Drain holds it only to wait, never while it delivers:
// the reader may hold a reference on the descriptor while it waits for
// turn, and the shard loop may close the socket (which waits for those
// references) while holding the shard lock that a handler may need.
type reader struct {
	sock   *Socket
	h      Handler
	gate   func(*Socket)
	turn   sync.Mutex
	b      *rxBatch
	readFn func(fd uintptr) bool
}

func newReader(sock *Socket, h Handler, gate func(*Socket)) *reader {
	rd := &reader{sock: sock, h: h, gate: gate, b: newRxBatch()}
	rd.readFn = rd.read
	return rd
}

// read is the RawConn.Read callback: one recvmmsg; false on EAGAIN parks
// the goroutine in the netpoller until the socket is readable. It returns
// true with rd.turn held (released by run after delivery), false without.
func (rd *reader) read(fd uintptr) bool {
	rd.turn.Lock()
	if !rd.b.recv(fd) {
		rd.turn.Unlock()
		return false
	}
	return true
}

func (rd *reader) run() {
	for {
		if rd.gate != nil {
			rd.gate(rd.sock)
		}
		if err := rd.sock.rc.Read(rd.readFn); err != nil {
			return // socket closed by the shard loop (retire or Close)
		}
		s := rd.sock.sh
		s.delivering.Add(1)
		full := rd.b.deliver(rd.sock, rd.h)
		rd.turn.Unlock()
		s.delivering.Add(-1)
		// Send what the turn queued (FlushAsync calls made while
		// delivering left it to us); after the decrement, so that a
		// FlushAsync that saw it nonzero had queued first.
		if s.queued() > 0 {
			s.c.turnFlushes.Add(1)
			s.flush()
		}
		if full {
			runtime.Gosched() // read budget spent: let other work run
		}
	}
}

// drainer is a shard's Drain state: its own receive buffers (allocated
// on first use), so that Drain never delivers from the reader's.
type drainer struct {
	mu      sync.Mutex
	b       *rxBatch
	fn      func(fd uintptr) // rc.Control callback (allocated once)
	fetched bool
}

// drain runs read turns on the calling goroutine until sock's queue is
// empty (at most maxDrainTurns), after a read turn of its reader in
// progress has been delivered (d.mu held).
func (d *drainer) drain(sock *Socket) {
	rd := sock.rd
	rd.turn.Lock() // a barrier: wait for the reader's turn in progress, if any
	//lint:ignore SA2001 the critical section is empty on purpose (barrier)
	rd.turn.Unlock()
	if d.b == nil {
		d.b = newRxBatch()
		d.fn = func(fd uintptr) { d.fetched = d.b.recv(fd) }
	}
	for range maxDrainTurns {
		d.fetched = false
		if sock.rc.Control(d.fn) != nil || !d.fetched {
			return // closed, or nothing queued
		}
		if !d.b.deliver(sock, rd.h) && d.b.err == 0 {
			return // a short turn emptied the queue
		}
	}
}
