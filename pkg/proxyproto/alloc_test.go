//go:build !race

package proxyproto

import (
	"net/netip"
	"testing"
)

func TestAppendNoAlloc(t *testing.T) {
	src, dst := netip.MustParseAddrPort("[2001:db8::1]:5"), netip.MustParseAddrPort("[2001:db8::2]:6")
	buf := make([]byte, 0, 2*MaxLen)
	n := testing.AllocsPerRun(100, func() {
		b := Append(buf[:0], V1, src, dst)
		Append(b, V2, src, dst)
	})
	if n != 0 {
		t.Fatalf("%v allocations", n)
	}
	// Zoned link-local addresses: the zone is not written, so the longest
	// header still fits a MaxLen buffer.
	src = netip.MustParseAddrPort("[fe80:ffff:ffff:ffff:ffff:ffff:ffff:ffff%" + longZone + "]:65535")
	dst = netip.MustParseAddrPort("[fe80:ffff:ffff:ffff:ffff:ffff:ffff:fffe%" + longZone + "]:65535")
	buf = make([]byte, 0, MaxLen)
	if n := testing.AllocsPerRun(100, func() { Append(buf[:0], V1, src, dst) }); n != 0 {
		t.Fatalf("zoned: %v allocations", n)
	}
}

func TestParseNoAlloc(t *testing.T) {
	ins := [][]byte{
		[]byte("PROXY TCP4 192.0.2.44 10.0.0.1 12345 80\r\n"),
		[]byte("PROXY TCP6 2001:db8::1 2001:db8::2 8080 443\r\n"),
		Append(nil, V2, netip.MustParseAddrPort("192.0.2.44:1"), netip.MustParseAddrPort("10.0.0.1:2")),
		Append(nil, V2, netip.MustParseAddrPort("[2001:db8::1]:1"), netip.MustParseAddrPort("[2001:db8::2]:2")),
		[]byte("PROXY TCP4 1.2.3.4 5.6.7.8 01 2\r\n"), // an error is a sentinel
	}
	n := testing.AllocsPerRun(100, func() {
		for _, b := range ins {
			Parse(b)
		}
	})
	if n != 0 {
		t.Fatalf("%v allocations", n)
	}
}
