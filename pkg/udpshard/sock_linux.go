package udpshard

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"os"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// sockBufBytes is the SO_RCVBUF/SO_SNDBUF size asked for (best effort: the
// kernel caps it at net.core.{r,w}mem_max).
const sockBufBytes = 4 << 20

// openSocket opens a non-blocking, unconnected UDP socket bound to bind
// with an ephemeral port, and registers it with the Go netpoller
// (os.NewFile on a non-blocking descriptor).
//
// The socket deliberately has no SO_REUSEPORT: Linux hands out an
// ephemeral port that is already bound by SO_REUSEPORT sockets of the
// same user (the port-0 search does not count them as conflicts), so such
// a socket could share its port with another process's socket (a local
// server, another client) and the kernel would split the answers meant
// for this client between them by flow hash. Without it the port is ours
// alone, and no later SO_REUSEPORT bind can join it.
//
// An invalid bind address means "any": a dual-stack IPv6 socket when the host
// supports IPv6, else IPv4 0.0.0.0. An IPv4 (or v4-mapped) address gives an
// IPv4 socket; :: gives a dual-stack socket; any other IPv6 address gives a
// v6-only socket.
func openSocket(bind netip.Addr) (*os.File, syscall.RawConn, int, bool, netip.AddrPort, error) {
	if !bind.IsValid() {
		f, rc, fam, dual, local, err := openFamily(netip.IPv6Unspecified())
		if err == nil {
			return f, rc, fam, dual, local, nil
		}
		return openFamily(netip.IPv4Unspecified())
	}
	return openFamily(bind.Unmap())
}

func openFamily(bind netip.Addr) (*os.File, syscall.RawConn, int, bool, netip.AddrPort, error) {
	fam := unix.AF_INET
	dual := false
	if bind.Is6() {
		fam = unix.AF_INET6
		dual = bind.IsUnspecified()
	}
	fd, err := unix.Socket(fam, unix.SOCK_DGRAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, unix.IPPROTO_UDP)
	if err != nil {
		return nil, nil, 0, false, netip.AddrPort{}, fmt.Errorf("udp socket: %w", err)
	}
	fail := func(what string, err error) (*os.File, syscall.RawConn, int, bool, netip.AddrPort, error) {
		unix.Close(fd)
		return nil, nil, 0, false, netip.AddrPort{}, fmt.Errorf("udp socket %s %s: %w", what, bind, err)
	}
	if fam == unix.AF_INET6 {
		v6only := 1
		if dual {
			v6only = 0
		}
		if err := unix.SetsockoptInt(fd, unix.IPPROTO_IPV6, unix.IPV6_V6ONLY, v6only); err != nil {
			return fail("IPV6_V6ONLY", err)
		}
	}
	_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUF, sockBufBytes)
	_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_SNDBUF, sockBufBytes)
	var sa unix.Sockaddr
	if fam == unix.AF_INET {
		sa = &unix.SockaddrInet4{Addr: bind.As4()}
	} else {
		sa = &unix.SockaddrInet6{Addr: bind.As16()}
	}
	if err := unix.Bind(fd, sa); err != nil {
		return fail("bind", err)
	}
	got, err := unix.Getsockname(fd)
	if err != nil {
		return fail("getsockname", err)
	}
	var local netip.AddrPort
	switch a := got.(type) {
	case *unix.SockaddrInet4:
		local = netip.AddrPortFrom(netip.AddrFrom4(a.Addr), uint16(a.Port))
	case *unix.SockaddrInet6:
		local = netip.AddrPortFrom(netip.AddrFrom16(a.Addr), uint16(a.Port))
	}
	f := os.NewFile(uintptr(fd), "udpshard:"+local.String())
	if f == nil {
		return fail("register", os.ErrInvalid)
	}
	rc, err := f.SyscallConn()
	if err != nil {
		f.Close()
		return nil, nil, 0, false, netip.AddrPort{}, fmt.Errorf("udp socket %s: raw conn: %w", bind, err)
	}
	return f, rc, fam, dual, local, nil
}

// putSockaddr writes to as a raw sockaddr of family fam into name and
// returns its length, or 0 when the address cannot be reached from a socket
// of that family.
func putSockaddr(name *unix.RawSockaddrInet6, fam int, dual bool, to netip.AddrPort) uint32 {
	addr := to.Addr()
	if fam == unix.AF_INET {
		if addr.Is4In6() {
			addr = addr.Unmap()
		}
		if !addr.Is4() {
			return 0
		}
		sa4 := (*unix.RawSockaddrInet4)(unsafe.Pointer(name))
		sa4.Family = unix.AF_INET
		binary.BigEndian.PutUint16((*[2]byte)(unsafe.Pointer(&sa4.Port))[:], to.Port())
		sa4.Addr = addr.As4()
		sa4.Zero = [8]byte{}
		return unix.SizeofSockaddrInet4
	}
	if addr.Is4() {
		if !dual {
			return 0
		}
		addr = netip.AddrFrom16(addr.As16())
	}
	name.Family = unix.AF_INET6
	binary.BigEndian.PutUint16((*[2]byte)(unsafe.Pointer(&name.Port))[:], to.Port())
	name.Flowinfo = 0
	name.Addr = addr.As16()
	name.Scope_id = 0
	return unix.SizeofSockaddrInet6
}

// getSockaddr decodes a raw sockaddr filled in by recvmmsg.
func getSockaddr(name *unix.RawSockaddrInet6) netip.AddrPort {
	switch name.Family {
	case unix.AF_INET:
		sa4 := (*unix.RawSockaddrInet4)(unsafe.Pointer(name))
		port := binary.BigEndian.Uint16((*[2]byte)(unsafe.Pointer(&sa4.Port))[:])
		return netip.AddrPortFrom(netip.AddrFrom4(sa4.Addr), port)
	case unix.AF_INET6:
		port := binary.BigEndian.Uint16((*[2]byte)(unsafe.Pointer(&name.Port))[:])
		return netip.AddrPortFrom(netip.AddrFrom16(name.Addr).Unmap(), port)
	}
	return netip.AddrPort{}
}

// sendmmsg and recvmmsg are thin wrappers: the caller owns the message
// arrays and keeps them (and everything they point to) alive.
//
// They are raw system calls (no entersyscall/exitsyscall): with
// MSG_DONTWAIT on a non-blocking socket they never sleep, they return
// after at most MaxBatch datagrams, and blocking is left to the netpoller
// (the RawConn callbacks return false on EAGAIN). Announcing them to the
// scheduler bought nothing and cost CPU per batch: every call woke an
// idle sysmon (which then polls every 20 µs for a while) and a call
// outlasting a sysmon tick had its P handed to another thread, which
// then had to be put to sleep again (about 15 % of the client's CPU per
// decision at 256 checks in flight; docs/bench/rlclient.md).
func sendmmsg(fd uintptr, msgs []unix.Mmsghdr) (int, syscall.Errno) {
	n, _, e := unix.RawSyscall6(unix.SYS_SENDMMSG, fd, uintptr(unsafe.Pointer(&msgs[0])), uintptr(len(msgs)), unix.MSG_DONTWAIT, 0, 0)
	return int(n), e
}

func recvmmsg(fd uintptr, msgs []unix.Mmsghdr) (int, syscall.Errno) {
	n, _, e := unix.RawSyscall6(unix.SYS_RECVMMSG, fd, uintptr(unsafe.Pointer(&msgs[0])), uintptr(len(msgs)), unix.MSG_DONTWAIT, 0, 0)
	return int(n), e
}
