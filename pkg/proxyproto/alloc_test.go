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
}
