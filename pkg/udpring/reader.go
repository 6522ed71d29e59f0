package udpring

import (
	"runtime"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// reader receives datagrams for one socket with recvmmsg, at most MaxBatch
// per read turn.
type reader struct {
	sock   *Socket
	h      Handler
	msgs   [MaxBatch]unix.Mmsghdr
	iov    [MaxBatch]unix.Iovec
	names  [MaxBatch]unix.RawSockaddrInet6
	bufs   [MaxBatch][recvBufSize]byte
	n      int
	err    syscall.Errno
	readFn func(fd uintptr) bool
}

func newReader(sock *Socket, h Handler) *reader {
	rd := &reader{sock: sock, h: h}
	for i := range rd.msgs {
		rd.iov[i].Base = &rd.bufs[i][0]
		rd.iov[i].SetLen(recvBufSize)
		rd.msgs[i].Hdr.Iov = &rd.iov[i]
		rd.msgs[i].Hdr.SetIovlen(1)
		rd.msgs[i].Hdr.Name = (*byte)(unsafe.Pointer(&rd.names[i]))
	}
	rd.readFn = rd.read
	return rd
}

// read is the RawConn.Read callback: one recvmmsg; false on EAGAIN parks
// the goroutine in the netpoller until the socket is readable.
func (rd *reader) read(fd uintptr) bool {
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
			return false
		default:
			rd.n, rd.err = 0, e
			return true
		}
	}
}

func (rd *reader) run() {
	s := rd.sock.sh
	for {
		if err := rd.sock.rc.Read(rd.readFn); err != nil {
			return // socket closed by the shard loop (retire or Close)
		}
		if rd.err != 0 {
			s.c.recvErr.Add(1)
			continue
		}
		if rd.n <= 0 {
			continue
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
		if rd.n == MaxBatch {
			runtime.Gosched() // read budget spent: let other work run
		}
	}
}
