package evloop

import (
	"net"
	"net/netip"
	"syscall"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

func TestSockaddrPort(t *testing.T) {
	v4 := func(a [4]byte, port uint16) (unix.RawSockaddrAny, uint32) {
		var rsa unix.RawSockaddrAny
		p := (*unix.RawSockaddrInet4)(unsafe.Pointer(&rsa))
		p.Family, p.Addr = unix.AF_INET, a
		p.Port = port>>8 | port<<8 // network order on this little-endian host's memory
		return rsa, unix.SizeofSockaddrInet4
	}
	v6 := func(a [16]byte, port uint16) (unix.RawSockaddrAny, uint32) {
		var rsa unix.RawSockaddrAny
		p := (*unix.RawSockaddrInet6)(unsafe.Pointer(&rsa))
		p.Family, p.Addr = unix.AF_INET6, a
		p.Port = port>>8 | port<<8
		return rsa, unix.SizeofSockaddrInet6
	}
	mapped := [16]byte{10: 0xff, 11: 0xff, 12: 10, 13: 0, 14: 0, 15: 7}
	for _, tc := range []struct {
		name string
		rsa  func() (unix.RawSockaddrAny, uint32)
		want netip.AddrPort
	}{
		{"ipv4", func() (unix.RawSockaddrAny, uint32) { return v4([4]byte{127, 0, 0, 1}, 8080) }, netip.MustParseAddrPort("127.0.0.1:8080")},
		{"ipv6", func() (unix.RawSockaddrAny, uint32) { return v6([16]byte{15: 1}, 443) }, netip.MustParseAddrPort("[::1]:443")},
		{"ipv4-mapped", func() (unix.RawSockaddrAny, uint32) { return v6(mapped, 65535) }, netip.MustParseAddrPort("10.0.0.7:65535")},
		{"short ipv4", func() (unix.RawSockaddrAny, uint32) { r, _ := v4([4]byte{1, 2, 3, 4}, 1); return r, 4 }, netip.AddrPort{}},
		{"short ipv6", func() (unix.RawSockaddrAny, uint32) { r, _ := v6([16]byte{15: 1}, 1); return r, 16 }, netip.AddrPort{}},
		{"unix", func() (unix.RawSockaddrAny, uint32) {
			var r unix.RawSockaddrAny
			r.Addr.Family = unix.AF_UNIX
			return r, 110
		}, netip.AddrPort{}},
	} {
		rsa, n := tc.rsa()
		if got := SockaddrPort(&rsa, n); got != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
}

// loopbackConn is a connected TCP client on loopback, its listener's
// address, and the client's raw descriptor access.
func loopbackConn(t *testing.T) (net.Conn, net.Addr, syscall.RawConn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	raw, err := c.(*net.TCPConn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	return c, ln.Addr(), raw
}

// TestLocalPeerAddr reads both ends of a real connection, and nothing
// from a closed descriptor.
func TestLocalPeerAddr(t *testing.T) {
	c, lnAddr, raw := loopbackConn(t)
	var local, peer netip.AddrPort
	raw.Control(func(fd uintptr) { local, peer = LocalAddr(int(fd)), PeerAddr(int(fd)) })
	if local.String() != c.LocalAddr().String() || peer.String() != lnAddr.String() {
		t.Fatalf("local %v peer %v, want %v and %v", local, peer, c.LocalAddr(), lnAddr)
	}
	if got := LocalAddr(-1); got.IsValid() {
		t.Fatalf("LocalAddr(-1) = %v", got)
	}
}
