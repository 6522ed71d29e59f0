package evloop

import (
	"net/netip"
	"unsafe"

	"golang.org/x/sys/unix"
)

// accept4 accepts one connection on lfd (non-blocking, close-on-exec)
// with the peer's address read into the loop's own buffer: unix.Accept4
// allocates a Sockaddr per connection, garbage that an idle connection's
// memory budget (1 KiB per idle connection) cannot afford at 10,000 of them.
func (l *Loop) accept4(lfd int) (int, netip.AddrPort, error) {
	n := uint32(unsafe.Sizeof(l.rsa))
	fd, _, e := unix.RawSyscall6(unix.SYS_ACCEPT4, uintptr(lfd), uintptr(unsafe.Pointer(&l.rsa)),
		uintptr(unsafe.Pointer(&n)), unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0, 0)
	if e != 0 {
		return -1, netip.AddrPort{}, e
	}
	return int(fd), SockaddrPort(&l.rsa, n), nil
}

// SockaddrPort is the IP address and port of a raw socket address of
// length n (IPv4-mapped IPv6 addresses unmapped); the zero AddrPort for
// any other family or a short one.
func SockaddrPort(rsa *unix.RawSockaddrAny, n uint32) netip.AddrPort {
	switch rsa.Addr.Family {
	case unix.AF_INET:
		if n < unix.SizeofSockaddrInet4 {
			return netip.AddrPort{}
		}
		a := (*unix.RawSockaddrInet4)(unsafe.Pointer(rsa))
		return netip.AddrPortFrom(netip.AddrFrom4(a.Addr), ntohs(a.Port))
	case unix.AF_INET6:
		if n < unix.SizeofSockaddrInet6 {
			return netip.AddrPort{}
		}
		a := (*unix.RawSockaddrInet6)(unsafe.Pointer(rsa))
		return netip.AddrPortFrom(netip.AddrFrom16(a.Addr).Unmap(), ntohs(a.Port))
	}
	return netip.AddrPort{}
}

// LocalAddr is fd's local address (getsockname) without allocating; the
// zero AddrPort when it cannot be read.
func LocalAddr(fd int) netip.AddrPort {
	var rsa unix.RawSockaddrAny
	n := uint32(unsafe.Sizeof(rsa))
	if _, _, e := unix.RawSyscall(unix.SYS_GETSOCKNAME, uintptr(fd), uintptr(unsafe.Pointer(&rsa)), uintptr(unsafe.Pointer(&n))); e != 0 {
		return netip.AddrPort{}
	}
	return SockaddrPort(&rsa, n)
}

// PeerAddr is fd's peer address (getpeername) without allocating; the
// zero AddrPort when it cannot be read.
func PeerAddr(fd int) netip.AddrPort {
	var rsa unix.RawSockaddrAny
	n := uint32(unsafe.Sizeof(rsa))
	if _, _, e := unix.RawSyscall(unix.SYS_GETPEERNAME, uintptr(fd), uintptr(unsafe.Pointer(&rsa)), uintptr(unsafe.Pointer(&n))); e != 0 {
		return netip.AddrPort{}
	}
	return SockaddrPort(&rsa, n)
}

// ntohs turns a port as the kernel stores it (network order) into a number.
func ntohs(p uint16) uint16 {
	b := (*[2]byte)(unsafe.Pointer(&p))
	return uint16(b[0])<<8 | uint16(b[1])
}
