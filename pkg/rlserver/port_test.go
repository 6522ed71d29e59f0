package rlserver

import (
	"net/netip"
	"testing"

	"github.com/rl-tproxy/rl-tproxy/pkg/ratelimitly/credentials"
	"golang.org/x/sys/unix"
)

// An ephemeral-port server never lands on a port that another process's
// SO_REUSEPORT socket already holds: the kernel would split the datagrams
// between the two.
func TestEphemeralPortNotShared(t *testing.T) {
	held := map[uint16]bool{}
	for range 300 {
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { unix.Close(fd) })
		if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_REUSEPORT, 1); err != nil {
			t.Fatal(err)
		}
		if err := unix.Bind(fd, &unix.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
			t.Fatal(err)
		}
		sa, err := unix.Getsockname(fd)
		if err != nil {
			t.Fatal(err)
		}
		held[uint16(sa.(*unix.SockaddrInet4).Port)] = true
	}
	for i := range 100 {
		s, err := Start(Config{Listen: "127.0.0.1:0", Workers: 2, Credentials: []credentials.Credential{testCred("a", 1, 1)}})
		if err != nil {
			t.Fatal(err)
		}
		port := s.Addr().Port()
		s.Close()
		if held[port] {
			t.Fatalf("server %d bound %v, a port another SO_REUSEPORT socket holds", i, netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), port))
		}
	}
}
