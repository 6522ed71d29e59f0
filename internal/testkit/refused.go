package testkit

import (
	"net/netip"
	"testing"

	"golang.org/x/sys/unix"
)

// RefusedAddr returns a loopback TCP address that refuses connections
// until t ends: a socket bound to it that never listens holds the port.
// A port taken from a closed listener instead can be bound again by a
// test running in parallel, and a connection meant to be refused then
// reaches that test's server and hangs.
func RefusedAddr(t testing.TB) string {
	t.Helper()
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatalf("refused address: socket: %v", err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	if err := unix.Bind(fd, &unix.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatalf("refused address: bind: %v", err)
	}
	sa, err := unix.Getsockname(fd)
	if err != nil {
		t.Fatalf("refused address: getsockname: %v", err)
	}
	in4, ok := sa.(*unix.SockaddrInet4)
	if !ok {
		t.Fatalf("refused address: bound to %T", sa)
	}
	return netip.AddrPortFrom(netip.AddrFrom4(in4.Addr), uint16(in4.Port)).String()
}
