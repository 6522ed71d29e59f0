package rlserver

import (
	"unsafe"

	"golang.org/x/sys/unix"
)

// Coalesced requests. With UDP_GRO on a socket, the kernel may hand over
// several datagrams of one sender in one message (every one but the last
// of the size the UDP_GRO cmsg gives). On loopback this matters most: a
// batching client (pkg/rlclient) sends its requests to a node as one
// UDP_SEGMENT message, and a socket that accepts coalesced messages
// receives it as the one buffer it was sent as, where a socket without
// UDP_GRO makes the kernel split it into one queued datagram per request
// inside the client's send call. The worker splits the message itself
// (worker.turn); each datagram is then handled exactly as before.
const (
	// groBufLen is a receive buffer with UDP_GRO on: a coalesced message
	// is at most one IP packet's payload.
	groBufLen = 1 << 16
	// groCmsgSpace is the control buffer of one received message: the
	// UDP_GRO cmsg (an int, the segment size).
	groCmsgSpace = (unix.SizeofCmsghdr + 4 + 7) &^ 7
)

// enableGRO turns UDP_GRO on for fd and makes the receive buffers large
// enough for a coalesced message. A kernel that refuses it keeps the
// datagram-sized buffers (every message one datagram).
func (b *batchConn) enableGRO(fd int) {
	if unix.SetsockoptInt(fd, unix.SOL_UDP, unix.UDP_GRO, 1) != nil {
		return
	}
	// Allocated once per socket; the pages a message never reaches are
	// never written (the kernel writes what arrives, the worker reads
	// what was written).
	b.rbufs, b.rlen, b.gro = make([]byte, MaxBatch*groBufLen), groBufLen, true
	for i := range b.rhdrs {
		b.riovs[i].Base = &b.rbufs[i*b.rlen]
		b.rhdrs[i].Hdr.Control = &b.rctrl[i][0]
	}
}

// segSize is the datagram size of a coalesced message i of the last read
// turn (its UDP_GRO cmsg), or 0 when it carries a single datagram.
func (b *batchConn) segSize(i int) int {
	h := &b.rhdrs[i].Hdr
	if !b.gro || h.Controllen < unix.SizeofCmsghdr {
		return 0
	}
	cm := (*unix.Cmsghdr)(unsafe.Pointer(&b.rctrl[i][0]))
	if cm.Level != unix.SOL_UDP || cm.Type != unix.UDP_GRO || int(cm.Len) < unix.CmsgLen(4) {
		return 0
	}
	return int(*(*int32)(unsafe.Pointer(&b.rctrl[i][unix.CmsgLen(0)])))
}

// nextDatagram cuts the first datagram off msg (seg: the segment size of
// a coalesced message, 0 for one datagram).
func nextDatagram(msg []byte, seg int) (pkt, rest []byte) {
	if seg <= 0 || seg >= len(msg) {
		return msg, nil
	}
	return msg[:seg], msg[seg:]
}
