package udpring

import (
	"runtime"
	"sync"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// maxDrainTurns bounds the read turns of one Drain call per socket.
const maxDrainTurns = 16

// reader receives datagrams for one socket with recvmmsg, at most MaxBatch
// per read turn.
//
// A read turn (one recvmmsg and the delivery of what it returned) runs
// under mu, so a read turn of the socket's reader goroutine and one of
// Drain never overlap: the buffers are shared, and Drain returning means
// that nothing taken from the kernel before it started is still waiting
// for delivery.
type reader struct {
	sock   *Socket
	h      Handler
	gate   func(*Socket)
	mu     sync.Mutex
	msgs   [MaxBatch]unix.Mmsghdr
	iov    [MaxBatch]unix.Iovec
	names  [MaxBatch]unix.RawSockaddrInet6
	bufs   [MaxBatch][recvBufSize]byte
	n      int
	err    syscall.Errno
	readFn func(fd uintptr) bool
	// drainFn is the rc.Control callback of Drain (allocated once).
	drainFn func(fd uintptr)
	drained bool // last drain turn found the queue empty
}

func newReader(sock *Socket, h Handler, gate func(*Socket)) *reader {
	rd := &reader{sock: sock, h: h, gate: gate}
	for i := range rd.msgs {
		rd.iov[i].Base = &rd.bufs[i][0]
		rd.iov[i].SetLen(recvBufSize)
		rd.msgs[i].Hdr.Iov = &rd.iov[i]
		rd.msgs[i].Hdr.SetIovlen(1)
		rd.msgs[i].Hdr.Name = (*byte)(unsafe.Pointer(&rd.names[i]))
	}
	rd.readFn = rd.read
	rd.drainFn = func(fd uintptr) { rd.drained = !rd.recv(fd) }
	return rd
}

// recv runs one non-blocking recvmmsg into the buffers (rd.mu held). It
// returns false when the socket has nothing queued (EAGAIN).
func (rd *reader) recv(fd uintptr) bool {
	for i := range rd.msgs {
		rd.msgs[i].Hdr.Namelen = unix.SizeofSockaddrInet6
		rd.msgs[i].Hdr.Flags = 0
		rd.msgs[i].Len = 0
	}
	for {
		n, e := recvmmsg(fd, rd.msgs[:])
		switch e {
		case 0:
			rd.n, rd.err = n, 0
			return true
		case unix.EINTR:
			continue
		case unix.EAGAIN:
			rd.n, rd.err = 0, 0
			return false
		default:
			rd.n, rd.err = 0, e
			return true
		}
	}
}

// read is the RawConn.Read callback: one recvmmsg; false on EAGAIN parks
// the goroutine in the netpoller until the socket is readable. It returns
// true with rd.mu held (released by run after delivery), false without.
func (rd *reader) read(fd uintptr) bool {
	rd.mu.Lock()
	if !rd.recv(fd) {
		rd.mu.Unlock()
		return false
	}
	return true
}

// deliver hands the datagrams of the last turn to the handler (rd.mu
// held) and reports whether the turn was full.
func (rd *reader) deliver() bool {
	s := rd.sock.sh
	if rd.err != 0 {
		s.c.recvErr.Add(1)
		return false
	}
	if rd.n <= 0 {
		return false
	}
	s.c.recvBatches.Add(1)
	delivered := 0
	for i := 0; i < rd.n; i++ {
		m := &rd.msgs[i]
		if m.Hdr.Flags&unix.MSG_TRUNC != 0 {
			s.c.truncated.Add(1)
			continue
		}
		delivered++
		rd.h(rd.sock, rd.bufs[i][:m.Len], getSockaddr(&rd.names[i]))
	}
	s.c.received.Add(uint64(delivered))
	return rd.n == MaxBatch
}

func (rd *reader) run() {
	for {
		if rd.gate != nil {
			rd.gate(rd.sock)
		}
		if err := rd.sock.rc.Read(rd.readFn); err != nil {
			return // socket closed by the shard loop (retire or Close)
		}
		full := rd.deliver()
		rd.mu.Unlock()
		if full {
			runtime.Gosched() // read budget spent: let other work run
		}
	}
}

// drain runs read turns on the calling goroutine until the socket's queue
// is empty (at most maxDrainTurns). It first waits for a read turn of the
// reader goroutine in progress to be delivered.
func (rd *reader) drain() {
	rd.mu.Lock()
	defer rd.mu.Unlock()
	for range maxDrainTurns {
		rd.drained = true
		if rd.sock.rc.Control(rd.drainFn) != nil || rd.drained {
			return
		}
		if !rd.deliver() && rd.err == 0 {
			return // a short turn emptied the queue
		}
	}
}
