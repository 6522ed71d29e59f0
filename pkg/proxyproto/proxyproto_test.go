package proxyproto

import (
	"net/netip"
	"testing"
)

// longZone is an interface name as long as Linux allows (IFNAMSIZ-1).
const longZone = "enp0s31f6-abcde"

func TestAppend(t *testing.T) {
	ap := netip.MustParseAddrPort
	tests := []struct {
		v        Version
		src, dst netip.AddrPort
		want     string
	}{
		{V1, ap("192.0.2.7:51234"), ap("10.0.0.1:443"), "PROXY TCP4 192.0.2.7 10.0.0.1 51234 443\r\n"},
		{V1, ap("[::ffff:192.0.2.7]:1"), ap("[::ffff:10.0.0.1]:80"), "PROXY TCP4 192.0.2.7 10.0.0.1 1 80\r\n"},
		{V1, ap("[2001:db8::1]:65535"), ap("[2001:db8::2]:8443"), "PROXY TCP6 2001:db8::1 2001:db8::2 65535 8443\r\n"},
		{V1, ap("192.0.2.7:5"), ap("[2001:db8::2]:6"), "PROXY TCP6 ::ffff:192.0.2.7 2001:db8::2 5 6\r\n"},
		{V1, netip.AddrPort{}, ap("10.0.0.1:443"), "PROXY UNKNOWN\r\n"},
		{V1, ap("[fe80::1%eth0]:5"), ap("[fe80::2%eth0]:6"), "PROXY TCP6 fe80::1 fe80::2 5 6\r\n"}, // zones dropped
		{V1, ap("[fe80::1%eth0]:5"), ap("10.0.0.1:6"), "PROXY TCP6 fe80::1 ::ffff:10.0.0.1 5 6\r\n"},
		{V2, ap("192.0.2.7:51234"), ap("10.0.0.1:443"),
			Signature + "\x21\x11\x00\x0c" + "\xc0\x00\x02\x07" + "\x0a\x00\x00\x01" + "\xc8\x22" + "\x01\xbb"},
		{V2, ap("[2001:db8::1]:1"), ap("[2001:db8::2]:2"),
			Signature + "\x21\x21\x00\x24" + "\x20\x01\x0d\xb8" + "\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x01" +
				"\x20\x01\x0d\xb8" + "\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x02" + "\x00\x01\x00\x02"},
		{V2, ap("[fe80::1%eth0]:1"), ap("[fe80::2%lo]:2"),
			Signature + "\x21\x21\x00\x24" + "\xfe\x80\x00\x00" + "\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x01" +
				"\xfe\x80\x00\x00" + "\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x02" + "\x00\x01\x00\x02"},
		{V2, netip.AddrPort{}, netip.AddrPort{}, Signature + "\x20\x00\x00\x00"},
		{None, ap("192.0.2.7:1"), ap("10.0.0.1:2"), ""},
	}
	for _, tt := range tests {
		got := Append([]byte("x"), tt.v, tt.src, tt.dst)
		if string(got) != "x"+tt.want {
			t.Errorf("%v %v %v:\n got %q\nwant %q", tt.v, tt.src, tt.dst, got[1:], tt.want)
		}
		if len(got)-1 > MaxLen {
			t.Errorf("%d bytes > MaxLen", len(got)-1)
		}
	}
	// The longest v1 header fits MaxLen.
	long := Append(nil, V1, ap("[ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff]:65535"), ap("[ffff:ffff:ffff:ffff:ffff:ffff:ffff:fffe]:65535"))
	if len(long) > MaxLen {
		t.Fatalf("%d > %d", len(long), MaxLen)
	}
	// Also with zones, which are not written.
	long = Append(nil, V1, ap("[ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff%"+longZone+"]:65535"), ap("[ffff:ffff:ffff:ffff:ffff:ffff:ffff:fffe%"+longZone+"]:65535"))
	if len(long) > MaxLen {
		t.Fatalf("zoned: %d > %d: %q", len(long), MaxLen, long)
	}
}

func TestParseVersion(t *testing.T) {
	for s, want := range map[string]Version{"": None, "v1": V1, "v2": V2} {
		if v, err := ParseVersion(s); err != nil || v != want || v.String() != s {
			t.Errorf("%q: %v %v", s, v, err)
		}
	}
	for _, s := range []string{"1", "V1", "v3", "yes"} {
		if _, err := ParseVersion(s); err == nil {
			t.Errorf("%q accepted", s)
		}
	}
}
