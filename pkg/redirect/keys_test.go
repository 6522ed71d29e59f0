package redirect

import (
	"encoding/binary"
	"net/netip"
	"testing"
)

// lpmKey is what SetPrefixes stores for p (nil ok = rejected).
func lpmKeyRoundTrip(p netip.Prefix) (netip.Prefix, bool) {
	if !p.IsValid() {
		return netip.Prefix{}, false
	}
	p = p.Masked()
	if p.Addr().Is4() {
		return prefixFromLPM4(lpm4(p.Addr(), p.Bits())), true
	}
	return prefixFromLPM6(lpm6(p.Addr(), p.Bits())), true
}

func TestLPMKeyLayout(t *testing.T) {
	// The trie compares bytes in memory order: the address must be stored
	// in network order whatever the host's endianness.
	k := lpm4(netip.MustParseAddr("10.1.2.3"), 24)
	var b [4]byte
	binary.NativeEndian.PutUint32(b[:], k.Addr)
	if b != [4]byte{10, 1, 2, 3} || k.Prefixlen != 24 {
		t.Fatalf("lpm4 key bytes %v len %d", b, k.Prefixlen)
	}
	bk := BypassKey(netip.MustParseAddrPort("127.0.0.1:40000"))
	binary.NativeEndian.PutUint32(b[:], bk.Addr[0])
	if b != [4]byte{127, 0, 0, 1} || bk.Port != 40000 || bk.Family != 2 || bk.Addr[1] != 0 {
		t.Fatalf("bypass key %+v", bk)
	}
	if m := BypassKey(netip.MustParseAddrPort("[::ffff:127.0.0.1]:40000")); m != bk {
		t.Fatalf("v4-mapped bypass key %+v, want %+v", m, bk)
	}
	for _, s := range []string{"10.0.0.0/8", "0.0.0.0/0", "192.168.1.7/32", "fd00::/8", "::/0", "2001:db8::1/128"} {
		p := netip.MustParsePrefix(s)
		if got, _ := lpmKeyRoundTrip(p); got != p {
			t.Errorf("round trip %v -> %v", p, got)
		}
	}
}

func FuzzLPMKeyRoundTrip(f *testing.F) {
	f.Add([]byte{10, 0, 0, 0}, uint8(8))
	f.Add([]byte{0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1}, uint8(64))
	f.Add([]byte{}, uint8(0))
	f.Fuzz(func(t *testing.T, addr []byte, bits uint8) {
		a, ok := netip.AddrFromSlice(addr)
		if !ok {
			return
		}
		p := netip.PrefixFrom(a, int(bits))
		got, ok := lpmKeyRoundTrip(p)
		if !ok {
			if p.IsValid() {
				t.Fatalf("valid prefix %v rejected", p)
			}
			return
		}
		if want := p.Masked(); got != want {
			t.Fatalf("round trip %v -> %v, want %v", p, got, want)
		}
	})
}
