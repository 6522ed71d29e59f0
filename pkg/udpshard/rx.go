package udpshard

import (
	"fmt"
	"sync/atomic"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

const (
	// groBufSize is a receive buffer with UDP_GRO on: one coalesced
	// buffer holds at most one IP packet's payload.
	groBufSize = 1 << 16
	// groBatch is the messages of one recvmmsg with UDP_GRO on (each may
	// carry many datagrams); fewer than MaxBatch to bound the buffers:
	// groBatch x 64 KiB of address space per socket, mapped apart from
	// the Go heap so that only the pages datagrams fill become resident.
	groBatch = 32
	// groCmsgSpace is the control buffer of one message: the UDP_GRO cmsg
	// (an int, the segment size).
	groCmsgSpace = (unix.SizeofCmsghdr + 4 + 7) &^ 7
)

// mappedBatches counts the receive buffer mappings not yet given back
// (tests).
var mappedBatches atomic.Int64

// rxBatch is the receive state of one recvmmsg: up to vlen messages, each
// one datagram, or with UDP_GRO (gro) possibly several datagrams of one
// sender coalesced by the kernel (every one but the last of the size the
// UDP_GRO cmsg gives).
type rxBatch struct {
	msgs  [MaxBatch]unix.Mmsghdr
	iov   [MaxBatch]unix.Iovec
	names [MaxBatch]unix.RawSockaddrInet6
	ctrl  [MaxBatch][groCmsgSpace]byte
	buf   []byte // vlen buffers of size bytes (mmap-ed with gro)
	size  int
	vlen  int
	gro   bool
	n     int
	err   syscall.Errno
	// delivered is the number of datagrams the last deliver handed on
	// (a message coalesced by UDP_GRO holds several).
	delivered int
}

// newRxBatch makes the buffers of one receive mode. With gro they are an
// anonymous mapping (never zeroed by the Go heap, so untouched pages
// stay unbacked), given back by release.
func newRxBatch(gro bool) (*rxBatch, error) {
	b := &rxBatch{gro: gro, size: recvBufSize, vlen: MaxBatch}
	if gro {
		b.size, b.vlen = groBufSize, groBatch
		buf, err := unix.Mmap(-1, 0, b.size*b.vlen, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
		if err != nil {
			return nil, fmt.Errorf("map receive buffers: %w", err)
		}
		b.buf = buf
		mappedBatches.Add(1)
	} else {
		b.buf = make([]byte, b.size*b.vlen)
	}
	for i := range b.vlen {
		b.iov[i].Base = &b.buf[i*b.size]
		b.iov[i].SetLen(b.size)
		b.msgs[i].Hdr.Iov = &b.iov[i]
		b.msgs[i].Hdr.SetIovlen(1)
		b.msgs[i].Hdr.Name = (*byte)(unsafe.Pointer(&b.names[i]))
		if gro {
			b.msgs[i].Hdr.Control = &b.ctrl[i][0]
		}
	}
	return b, nil
}

// release gives mapped buffers back; b is not used afterwards.
func (b *rxBatch) release() {
	if b.gro && b.buf != nil {
		_ = unix.Munmap(b.buf)
		b.buf = nil
		mappedBatches.Add(-1)
	}
}

// recv runs one non-blocking recvmmsg into the buffers. It returns false
// when the socket has nothing queued (EAGAIN).
func (b *rxBatch) recv(fd uintptr) bool {
	for i := range b.vlen {
		h := &b.msgs[i].Hdr
		h.Namelen = unix.SizeofSockaddrInet6
		h.Flags = 0
		if b.gro {
			h.SetControllen(groCmsgSpace)
		}
		b.msgs[i].Len = 0
	}
	for {
		n, e := recvmmsg(fd, b.msgs[:b.vlen])
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

// segSize is the datagram size of a coalesced message i (its UDP_GRO
// cmsg), or 0 when it carries a single datagram.
func (b *rxBatch) segSize(i int) int {
	h := &b.msgs[i].Hdr
	if !b.gro || h.Controllen < unix.SizeofCmsghdr {
		return 0
	}
	cm := (*unix.Cmsghdr)(unsafe.Pointer(&b.ctrl[i][0]))
	if cm.Level != unix.SOL_UDP || cm.Type != unix.UDP_GRO || int(cm.Len) < unix.CmsgLen(4) {
		return 0
	}
	return int(*(*int32)(unsafe.Pointer(&b.ctrl[i][unix.CmsgLen(0)])))
}

// deliver hands the datagrams of the last recv to h and reports whether
// the turn was full.
func (b *rxBatch) deliver(sock *Socket, h Handler) bool {
	s := sock.sh
	b.delivered = 0
	if b.err != 0 {
		s.c.recvErr.Add(1)
		return false
	}
	if b.n <= 0 {
		return false
	}
	s.c.recvBatches.Add(1)
	var delivered, coalesced uint64
	for i := 0; i < b.n; i++ {
		m := &b.msgs[i]
		if m.Hdr.Flags&unix.MSG_TRUNC != 0 {
			s.c.truncated.Add(1)
			continue
		}
		from := getSockaddr(&b.names[i])
		pkt := b.buf[i*b.size : i*b.size+int(m.Len)]
		seg := b.segSize(i)
		if seg <= 0 || seg >= len(pkt) {
			delivered++
			h(sock, pkt[:len(pkt):len(pkt)], from)
			continue
		}
		for off := 0; off < len(pkt); off += seg {
			end := min(off+seg, len(pkt))
			delivered++
			coalesced++
			h(sock, pkt[off:end:end], from) // capped: the handler may not reach the next one
		}
	}
	b.delivered = int(delivered)
	s.c.received.Add(delivered)
	if coalesced > 0 {
		s.c.groDatagrams.Add(coalesced)
	}
	return b.n == b.vlen
}
