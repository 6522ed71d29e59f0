package rlserver

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/rl-tproxy/rl-tproxy/pkg/ratelimitly/wire"
)

// MaxBatch is the most datagrams one read turn (recvmmsg) takes and one
// write turn (sendmmsg) sends.
const MaxBatch = 64

// recvBufLen is larger than wire.MaxDatagram so oversized datagrams are
// seen (and dropped) instead of silently truncated.
const recvBufLen = 2048

// freeUDPPort returns a UDP port on addr that no socket holds: a bind
// without SO_REUSEPORT only succeeds on such a port. The probe socket is
// closed before the caller binds its SO_REUSEPORT group there; a socket that
// takes the port in between makes that bind fail (no sharing with a
// non-reuseport socket) or is, at worst, as unlucky as before.
func freeUDPPort(addr netip.Addr) (uint16, error) {
	c, err := net.ListenUDP("udp", net.UDPAddrFromAddrPort(netip.AddrPortFrom(addr, 0)))
	if err != nil {
		return 0, fmt.Errorf("reserve a free port: %w", err)
	}
	port := c.LocalAddr().(*net.UDPAddr).AddrPort().Port()
	c.Close()
	return port, nil
}

// bindReusePort opens a non-blocking UDP socket with SO_REUSEPORT bound to
// addr and returns its descriptor.
func bindReusePort(addr netip.AddrPort) (int, error) {
	family := unix.AF_INET
	if addr.Addr().Is6() && !addr.Addr().Is4In6() {
		family = unix.AF_INET6
	}
	fd, err := unix.Socket(family, unix.SOCK_DGRAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, unix.IPPROTO_UDP)
	if err != nil {
		return -1, fmt.Errorf("socket: %w", err)
	}
	if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_REUSEPORT, 1); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("SO_REUSEPORT: %w", err)
	}
	// A larger receive queue absorbs bursts; failure is not fatal.
	_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUF, 4<<20)
	var sa unix.Sockaddr
	if family == unix.AF_INET {
		sa = &unix.SockaddrInet4{Port: int(addr.Port()), Addr: addr.Addr().Unmap().As4()}
	} else {
		sa = &unix.SockaddrInet6{Port: int(addr.Port()), Addr: addr.Addr().As16()}
	}
	if err := unix.Bind(fd, sa); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("bind %s: %w", addr, err)
	}
	return fd, nil
}

// listenReusePort binds like bindReusePort and hands the socket to the Go
// netpoller.
func listenReusePort(addr netip.AddrPort) (*net.UDPConn, error) {
	fd, err := bindReusePort(addr)
	if err != nil {
		return nil, err
	}
	f := os.NewFile(uintptr(fd), "udp:"+addr.String())
	pc, err := net.FilePacketConn(f)
	f.Close() // FilePacketConn dups the descriptor
	if err != nil {
		return nil, fmt.Errorf("file conn: %w", err)
	}
	uc, ok := pc.(*net.UDPConn)
	if !ok {
		pc.Close()
		return nil, errors.New("not a UDP socket")
	}
	return uc, nil
}

// localAddrPort is the bound address of a raw socket.
func localAddrPort(fd int) (netip.AddrPort, error) {
	sa, err := unix.Getsockname(fd)
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("getsockname: %w", err)
	}
	switch a := sa.(type) {
	case *unix.SockaddrInet4:
		return netip.AddrPortFrom(netip.AddrFrom4(a.Addr), uint16(a.Port)), nil
	case *unix.SockaddrInet6:
		return netip.AddrPortFrom(netip.AddrFrom16(a.Addr), uint16(a.Port)), nil
	}
	return netip.AddrPort{}, errors.New("getsockname: not an IP socket")
}

// batchConn does batched receive (recvmmsg) and send (sendmmsg) on one UDP
// socket. A worker's socket goes through the netpoller: the callbacks
// return false on EAGAIN so the goroutine parks until the socket is ready;
// no busy loop, no blocking syscall. A driven socket (conn == nil, loop.go)
// is a raw descriptor its owner polls: every call is tried once and EAGAIN
// is reported, never waited for. All buffers are allocated once.
type batchConn struct {
	conn *net.UDPConn    // nil: driven
	rc   syscall.RawConn // nil: driven
	fd   int             // the descriptor (driven: owned here)

	rhdrs  [MaxBatch]unix.Mmsghdr
	riovs  [MaxBatch]unix.Iovec
	rnames [MaxBatch]unix.RawSockaddrInet6
	rbufs  []byte // MaxBatch buffers of rlen bytes (gro.go)
	rlen   int
	rctrl  [MaxBatch][groCmsgSpace]byte
	gro    bool // UDP_GRO on: a message may carry several datagrams

	shdrs [MaxBatch]unix.Mmsghdr
	siovs [MaxBatch]unix.Iovec
	sbufs [MaxBatch][wire.MaxDatagram]byte

	// state of the current read / write turn, used by the callbacks
	rmax, rn int
	rerr     error
	soff, sk int
	serr     error
	sfail    int // messages skipped because sendmmsg failed on them

	gso gsoState

	readFn, writeFn func(fd uintptr) bool
	drainFn         func(fd uintptr)
}

func newBatchConn(c *net.UDPConn) (*batchConn, error) {
	rc, err := c.SyscallConn()
	if err != nil {
		return nil, err
	}
	b := newBatchBufs()
	b.conn, b.rc, b.fd = c, rc, -1
	_ = rc.Control(func(fd uintptr) { b.enableGRO(int(fd)) })
	return b, nil
}

// newDrivenConn wraps the raw non-blocking socket fd (which it owns from
// now on) for an owner that polls it.
func newDrivenConn(fd int) *batchConn {
	b := newBatchBufs()
	b.fd = fd
	b.enableGRO(fd)
	return b
}

func newBatchBufs() *batchConn {
	b := &batchConn{rbufs: make([]byte, MaxBatch*recvBufLen), rlen: recvBufLen}
	for i := range b.rhdrs {
		b.riovs[i].Base = &b.rbufs[i*b.rlen]
		b.rhdrs[i].Hdr.Iov = &b.riovs[i]
		b.rhdrs[i].Hdr.Iovlen = 1
		b.rhdrs[i].Hdr.Name = (*byte)(unsafe.Pointer(&b.rnames[i]))
		b.shdrs[i].Hdr.Iov = &b.siovs[i]
		b.shdrs[i].Hdr.Iovlen = 1
	}
	b.readFn = b.doRead
	b.writeFn = b.doWrite
	b.drainFn = b.doDrain
	b.gso.fn = b.doWriteGSO
	return b
}

// close closes the socket.
func (b *batchConn) close() {
	if b.conn != nil {
		b.conn.Close()
		return
	}
	if b.fd >= 0 {
		unix.Close(b.fd)
		b.fd = -1
	}
}

// toNetpoller moves a driven socket into the Go netpoller (for a worker
// goroutine).
func (b *batchConn) toNetpoller() error {
	f := os.NewFile(uintptr(b.fd), "udp")
	pc, err := net.FilePacketConn(f)
	if err != nil {
		f.Close()
		b.fd = -1
		return fmt.Errorf("file conn: %w", err)
	}
	uc, ok := pc.(*net.UDPConn)
	if !ok {
		pc.Close()
		f.Close()
		b.fd = -1
		return errors.New("not a UDP socket")
	}
	rc, err := uc.SyscallConn()
	if err != nil {
		uc.Close()
		f.Close()
		b.fd = -1
		return err
	}
	f.Close() // FilePacketConn dups the descriptor
	b.conn, b.rc = uc, rc
	_ = rc.Control(func(fd uintptr) { b.fd = int(fd) })
	return nil
}

// errWouldBlock: a driven socket's send buffer is full.
var errWouldBlock = errors.New("rlserver: socket send buffer full")

// write runs a send callback: through the netpoller (parking while it
// reports EAGAIN), or once on a driven socket.
func (b *batchConn) write(fn func(fd uintptr) bool) error {
	if b.rc != nil {
		return b.rc.Write(fn)
	}
	if !fn(uintptr(b.fd)) {
		return errWouldBlock
	}
	return nil
}

func (b *batchConn) prepareRead(max int) {
	b.rmax, b.rn, b.rerr = max, 0, nil
	for i := 0; i < max; i++ {
		h := &b.rhdrs[i]
		h.Hdr.Namelen = uint32(unsafe.Sizeof(b.rnames[i]))
		h.Hdr.Flags = 0
		h.Len = 0
		b.riovs[i].SetLen(b.rlen)
		if b.gro {
			h.Hdr.SetControllen(groCmsgSpace)
		}
	}
}

// recv reads up to max datagrams, parking in the netpoller until at least
// one is available.
func (b *batchConn) recv(max int) (int, error) {
	b.prepareRead(max)
	if err := b.rc.Read(b.readFn); err != nil {
		return 0, err
	}
	return b.rn, b.rerr
}

// recvNow reads up to max datagrams without waiting (0 when none queued).
// It works after the read deadline passed, for draining, and is the read
// of a driven socket.
func (b *batchConn) recvNow(max int) (int, error) {
	b.prepareRead(max)
	if b.rc == nil {
		b.doDrain(uintptr(b.fd))
		return b.rn, b.rerr
	}
	if err := b.rc.Control(b.drainFn); err != nil {
		return 0, err
	}
	return b.rn, b.rerr
}

// mmsg runs recvmmsg or sendmmsg. It is a raw system call (no
// entersyscall/exitsyscall): with MSG_DONTWAIT on a non-blocking socket it
// never sleeps (waiting is the netpoller's job), and announcing it to the
// scheduler only cost CPU: every call woke an idle sysmon, and a call
// that outlasted a sysmon tick had its P handed to another thread.
func (b *batchConn) mmsg(fd uintptr, trap uintptr, hdrs *unix.Mmsghdr, n int) (int, unix.Errno) {
	for {
		r, _, e := unix.RawSyscall6(trap, fd, uintptr(unsafe.Pointer(hdrs)), uintptr(n), unix.MSG_DONTWAIT, 0, 0)
		if e == unix.EINTR {
			continue
		}
		return int(r), e
	}
}

func (b *batchConn) doRead(fd uintptr) bool {
	n, e := b.mmsg(fd, unix.SYS_RECVMMSG, &b.rhdrs[0], b.rmax)
	if e == unix.EAGAIN {
		return false
	}
	if e != 0 {
		b.rerr = e
		return true
	}
	b.rn = n
	return true
}

func (b *batchConn) doDrain(fd uintptr) {
	n, e := b.mmsg(fd, unix.SYS_RECVMMSG, &b.rhdrs[0], b.rmax)
	if e != 0 && e != unix.EAGAIN {
		b.rerr = e
	}
	if e == 0 {
		b.rn = n
	}
}

// message i of the last read turn: one datagram, or with UDP_GRO several
// of one sender (segments of seg bytes, the last maybe shorter; seg 0:
// one datagram). truncated reports a message longer than the buffer.
func (b *batchConn) message(i int) (msg []byte, seg int, truncated bool) {
	h := &b.rhdrs[i]
	off := i * b.rlen
	return b.rbufs[off : off+int(h.Len)], b.segSize(i), h.Hdr.Flags&unix.MSG_TRUNC != 0
}

// setReply makes send slot k carry sbufs[k][:n] to the source of
// received datagram i.
func (b *batchConn) setReply(k, i, n int) {
	b.siovs[k].Base = &b.sbufs[k][0]
	b.siovs[k].SetLen(n)
	b.shdrs[k].Hdr.Name = b.rhdrs[i].Hdr.Name
	b.shdrs[k].Hdr.Namelen = b.rhdrs[i].Hdr.Namelen
	b.shdrs[k].Len = 0
}

// send transmits send slots 0..k-1, parking in the netpoller while the
// socket buffer is full: answers to one client socket share segmented
// messages (gso.go). It returns how many datagrams the kernel refused.
func (b *batchConn) send(k int) (failed int, err error) {
	if k > 1 && !b.gso.refused {
		return b.sendGSO(0, k)
	}
	return b.sendRange(0, k)
}

// sendRange transmits send slots off..k-1, one message per datagram.
func (b *batchConn) sendRange(off, k int) (failed int, err error) {
	b.soff, b.sk, b.serr, b.sfail = off, k, nil, 0
	for b.soff < b.sk {
		if err := b.write(b.writeFn); err != nil {
			return b.sfail + b.sk - b.soff, err
		}
	}
	return b.sfail, nil
}

func (b *batchConn) doWrite(fd uintptr) bool {
	n, e := b.mmsg(fd, unix.SYS_SENDMMSG, &b.shdrs[b.soff], b.sk-b.soff)
	if e == unix.EAGAIN {
		return false
	}
	if e != 0 {
		// the first message failed (e.g. unreachable peer): skip it
		b.soff++
		b.sfail++
		return true
	}
	b.soff += n
	return true
}
