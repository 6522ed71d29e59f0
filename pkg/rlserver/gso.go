package rlserver

import (
	"sync/atomic"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Segmented replies. The answers of one read turn that go to the same
// client socket with the same size (the last may be shorter) leave as one
// sendmmsg message with a UDP_SEGMENT cmsg (UDP GSO): the kernel runs its
// output path once per message and splits it into ordinary datagrams at
// the device (or at the receiving socket on loopback), so clients see no
// difference. A batching client (pkg/rlclient sends from one socket per
// shard) gets a turn's answers in a few messages instead of one per
// datagram; a client with a socket per request gains nothing and loses
// nothing. A socket on which the kernel refuses segmentation (no checksum
// offload, an IPsec route, an old kernel) falls back to one message per
// datagram for good.
const (
	// gsoMaxSegments bounds the datagrams of one segmented message (the
	// kernel's UDP_MAX_SEGMENTS is 64 on older kernels).
	gsoMaxSegments = 64
	// gsoMaxSegSize: larger answers go alone. A segment must fit the path
	// MTU whole (the kernel refuses to fragment it), so only answers that
	// fit the IPv6 minimum MTU are grouped.
	gsoMaxSegSize = 1200
	// gsoMaxBytes bounds the payload of one segmented message: it is one
	// IP packet until it is segmented (64 KiB), and a larger one would be
	// refused and turn segmentation off for the socket.
	gsoMaxBytes = 60000
	// gsoCmsgSpace is the control buffer of one message: a UDP_SEGMENT
	// cmsg with a uint16.
	gsoCmsgSpace = (unix.SizeofCmsghdr + 2 + 7) &^ 7
)

// gsoState is a batchConn's segmented-send state (worker goroutine only).
type gsoState struct {
	hdrs    [MaxBatch]unix.Mmsghdr
	ctrl    [MaxBatch][gsoCmsgSpace]byte
	first   [MaxBatch]int // first send slot of each message
	cnt     [MaxBatch]int // datagrams of each message
	n       int           // messages built
	off     int           // first message not yet sent
	err     unix.Errno    // error of the message at off, if any
	fn      func(fd uintptr) bool
	refused bool          // segmentation refused on this socket: one message per datagram
	segs    atomic.Uint64 // datagrams sent inside segmented messages
}

// sameDest reports whether send slots i and j go to the same address.
func (b *batchConn) sameDest(i, j int) bool {
	a, c := &b.shdrs[i].Hdr, &b.shdrs[j].Hdr
	if a.Namelen != c.Namelen {
		return false
	}
	if a.Name == c.Name {
		return true
	}
	n := int(a.Namelen)
	return string(unsafe.Slice(a.Name, n)) == string(unsafe.Slice(c.Name, n))
}

// buildGSO groups send slots off..k-1 into messages: runs of consecutive
// slots to one destination where every datagram but the last has the
// first one's size.
func (b *batchConn) buildGSO(off, k int) {
	g := &b.gso
	g.n, g.off = 0, 0
	for i := off; i < k; {
		seg := int(b.siovs[i].Len)
		j, bytes := i+1, seg
		if seg > 0 && seg <= gsoMaxSegSize {
			for j < k && j-i < gsoMaxSegments && int(b.siovs[j-1].Len) == seg &&
				int(b.siovs[j].Len) <= seg && b.siovs[j].Len > 0 &&
				bytes+int(b.siovs[j].Len) <= gsoMaxBytes && b.sameDest(i, j) {
				bytes += int(b.siovs[j].Len)
				j++
			}
		}
		h := &g.hdrs[g.n]
		h.Hdr.Name = b.shdrs[i].Hdr.Name
		h.Hdr.Namelen = b.shdrs[i].Hdr.Namelen
		h.Hdr.Iov = &b.siovs[i]
		h.Hdr.SetIovlen(j - i)
		h.Len = 0
		if j-i > 1 {
			c := &g.ctrl[g.n]
			cm := (*unix.Cmsghdr)(unsafe.Pointer(&c[0]))
			cm.Level = unix.SOL_UDP
			cm.Type = unix.UDP_SEGMENT
			cm.SetLen(unix.CmsgLen(2))
			*(*uint16)(unsafe.Pointer(&c[unix.CmsgLen(0)])) = uint16(seg)
			h.Hdr.Control = &c[0]
			h.Hdr.SetControllen(gsoCmsgSpace)
		} else {
			h.Hdr.Control = nil
			h.Hdr.SetControllen(0)
		}
		g.first[g.n], g.cnt[g.n] = i, j-i
		g.n++
		i = j
	}
}

// sendGSO sends slots off..k-1 in segmented messages; on a socket that
// refuses segmentation it sends the rest one datagram per message. It
// returns the number of datagrams the kernel refused.
func (b *batchConn) sendGSO(off, k int) (failed int, err error) {
	g := &b.gso
	b.buildGSO(off, k)
	for g.off < g.n {
		g.err = 0
		if err := b.write(g.fn); err != nil {
			for m := g.off; m < g.n; m++ {
				failed += g.cnt[m]
			}
			return failed, err
		}
		if g.err == 0 {
			continue
		}
		if g.cnt[g.off] > 1 && gsoRefused(g.err) {
			g.refused = true
			f, err := b.sendRange(g.first[g.off], k)
			return failed + f, err
		}
		failed += g.cnt[g.off] // e.g. an unreachable peer: skip its datagrams
		g.off++
	}
	return failed, nil
}

// doWriteGSO is the RawConn.Write callback of sendGSO.
func (b *batchConn) doWriteGSO(fd uintptr) bool {
	g := &b.gso
	n, e := b.mmsg(fd, unix.SYS_SENDMMSG, &g.hdrs[g.off], g.n-g.off)
	switch e {
	case 0:
		var segs uint64
		for m := g.off; m < g.off+n; m++ {
			if g.cnt[m] > 1 {
				segs += uint64(g.cnt[m])
			}
		}
		if segs > 0 {
			g.segs.Add(segs)
		}
		g.off += n
		return true
	case unix.EAGAIN:
		return false
	}
	g.err = e
	return true
}

// gsoRefused reports whether a sendmmsg error on a UDP_SEGMENT message
// means the kernel, device or route cannot segment it.
func gsoRefused(e syscall.Errno) bool {
	switch e {
	case unix.EIO, unix.EINVAL, unix.EMSGSIZE, unix.ENOPROTOOPT, unix.EOPNOTSUPP:
		return true
	}
	return false
}
