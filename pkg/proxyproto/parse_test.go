package proxyproto

import (
	"errors"
	"net/netip"
	"strings"
	"testing"
)

func v2(verCmd, fam byte, body ...byte) []byte {
	b := append([]byte(Signature), verCmd, fam, byte(len(body)>>8), byte(len(body)))
	return append(b, body...)
}

var (
	v2IPv4 = []byte{192, 0, 2, 44, 10, 0, 0, 1, 0x30, 0x39, 0, 80}
	v2IPv6 = append(append(netip.MustParseAddr("2001:db8::1").AsSlice(), netip.MustParseAddr("2001:db8::2").AsSlice()...), 0x1f, 0x90, 0x01, 0xbb)
)

func TestParse(t *testing.T) {
	ap := netip.MustParseAddrPort
	for _, tc := range []struct {
		name     string
		in       []byte
		want     Header
		n        int // bytes the header takes (the rest is the client's)
		err      error
		trailing string
	}{
		{name: "v1 tcp4", in: []byte("PROXY TCP4 192.0.2.44 10.0.0.1 12345 80\r\nGET / HTTP/1.1\r\n"),
			want: Header{Version: V1, Src: ap("192.0.2.44:12345"), Dst: ap("10.0.0.1:80")}, n: 41},
		{name: "v1 tcp6", in: []byte("PROXY TCP6 2001:db8::1 2001:db8::2 8080 443\r\n"),
			want: Header{Version: V1, Src: ap("[2001:db8::1]:8080"), Dst: ap("[2001:db8::2]:443")}, n: 45},
		{name: "v1 port 0 and 65535", in: []byte("PROXY TCP4 1.2.3.4 5.6.7.8 0 65535\r\n"),
			want: Header{Version: V1, Src: ap("1.2.3.4:0"), Dst: ap("5.6.7.8:65535")}, n: 36},
		{name: "v1 unknown", in: []byte("PROXY UNKNOWN\r\n"), want: Header{Version: V1, Local: true}, n: 15},
		{name: "v1 unknown with addresses", in: []byte("PROXY UNKNOWN ffff::1 ffff::2 1 2\r\n"), want: Header{Version: V1, Local: true}, n: 35},
		{name: "v2 tcp4", in: append(v2(0x21, 0x11, v2IPv4...), "GET"...),
			want: Header{Version: V2, Src: ap("192.0.2.44:12345"), Dst: ap("10.0.0.1:80")}, n: 28},
		{name: "v2 tcp6", in: v2(0x21, 0x21, v2IPv6...),
			want: Header{Version: V2, Src: ap("[2001:db8::1]:8080"), Dst: ap("[2001:db8::2]:443")}, n: 52},
		{name: "v2 local", in: v2(0x20, 0x00), want: Header{Version: V2, Local: true}, n: 16},
		{name: "v2 local with addresses", in: v2(0x20, 0x11, v2IPv4...), want: Header{Version: V2, Local: true}, n: 28},
		{name: "v2 proxy unspec", in: v2(0x21, 0x00), want: Header{Version: V2, Local: true}, n: 16},
		{name: "v2 unspec with a bad TLV", in: v2(0x21, 0x00, 1, 2, 3), err: ErrV2TLV},
		{name: "v2 tlvs", in: v2(0x21, 0x11, append(append([]byte{}, v2IPv4...), 0x04, 0, 2, 'a', 'b', 0x30, 0, 0)...),
			want: Header{Version: V2, Src: ap("192.0.2.44:12345"), Dst: ap("10.0.0.1:80")}, n: 36},

		{name: "not proxy: HTTP", in: []byte("GET / HTTP/1.1\r\n"), err: ErrNotProxy},
		{name: "not proxy: TLS", in: []byte{0x16, 3, 1}, err: ErrNotProxy},
		{name: "not proxy: PROXZ", in: []byte("PROXZ TCP4"), err: ErrNotProxy},
		{name: "not proxy: almost v2", in: []byte("\r\n\r\n\x00\r\nQUIX\n"), err: ErrNotProxy},
		{name: "v1 lower case", in: []byte("PROXY tcp4 1.2.3.4 5.6.7.8 1 2\r\n"), err: ErrV1Syntax},
		{name: "v1 two spaces", in: []byte("PROXY TCP4  1.2.3.4 5.6.7.8 1 2\r\n"), err: ErrV1Syntax},
		{name: "v1 trailing space", in: []byte("PROXY TCP4 1.2.3.4 5.6.7.8 1 2 \r\n"), err: ErrV1Syntax},
		{name: "v1 missing port", in: []byte("PROXY TCP4 1.2.3.4 5.6.7.8 1\r\n"), err: ErrV1Syntax},
		{name: "v1 family mismatch", in: []byte("PROXY TCP4 2001:db8::1 5.6.7.8 1 2\r\n"), err: ErrV1Syntax},
		{name: "v1 mapped in TCP4", in: []byte("PROXY TCP6 1.2.3.4 5.6.7.8 1 2\r\n"), err: ErrV1Syntax},
		{name: "v1 zone", in: []byte("PROXY TCP6 fe80::1%eth0 fe80::2 1 2\r\n"), err: ErrV1Syntax},
		{name: "v1 port leading zero", in: []byte("PROXY TCP4 1.2.3.4 5.6.7.8 01 2\r\n"), err: ErrV1Syntax},
		{name: "v1 port sign", in: []byte("PROXY TCP4 1.2.3.4 5.6.7.8 +1 2\r\n"), err: ErrV1Syntax},
		{name: "v1 port over 65535", in: []byte("PROXY TCP4 1.2.3.4 5.6.7.8 65536 2\r\n"), err: ErrV1Syntax},
		{name: "v1 ipv4 leading zero", in: []byte("PROXY TCP4 01.2.3.4 5.6.7.8 1 2\r\n"), err: ErrV1Syntax},
		{name: "v1 bare LF", in: []byte("PROXY TCP4 1.2.3.4 5.6.7.8 1 2\n"), err: ErrV1Syntax},
		{name: "v1 too long", in: []byte("PROXY UNKNOWN " + strings.Repeat("x", 100)), err: ErrV1TooLong},
		{name: "v1 UDP4", in: []byte("PROXY UDP4 1.2.3.4 5.6.7.8 1 2\r\n"), err: ErrV1Syntax},
		{name: "v2 version 1", in: v2(0x11, 0x11, v2IPv4...), err: ErrV2Command},
		{name: "v2 command 2", in: v2(0x22, 0x11, v2IPv4...), err: ErrV2Command},
		{name: "v2 udp4", in: v2(0x21, 0x12, v2IPv4...), err: ErrV2Family},
		{name: "v2 unix", in: v2(0x21, 0x31, make([]byte, 216)...), err: ErrV2Family},
		{name: "v2 short for ipv4", in: v2(0x21, 0x11, v2IPv4[:11]...), err: ErrV2Length},
		{name: "v2 short for ipv6", in: v2(0x21, 0x21, v2IPv4...), err: ErrV2Length},
		{name: "v2 tlv overruns", in: v2(0x21, 0x11, append(append([]byte{}, v2IPv4...), 0x04, 0, 9, 'a')...), err: ErrV2TLV},
		{name: "v2 tlv stub", in: v2(0x21, 0x11, append(append([]byte{}, v2IPv4...), 0x04, 0)...), err: ErrV2TLV},
		{name: "v2 too long", in: v2(0x21, 0x11, make([]byte, MaxV2Len)...), err: ErrV2TooLong},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h, n, err := Parse(tc.in)
			if !errors.Is(err, tc.err) {
				t.Fatalf("err = %v, want %v", err, tc.err)
			}
			if err != nil {
				return
			}
			if h != tc.want || n != tc.n {
				t.Fatalf("got %+v, %d bytes; want %+v, %d", h, n, tc.want, tc.n)
			}
		})
	}
}

// Every proper prefix of a valid header asks for more bytes, never
// passes as a header or fails: a peer that sends its header one byte at
// a time is read, not refused.
func TestParseIncomplete(t *testing.T) {
	for _, full := range [][]byte{
		[]byte("PROXY TCP4 192.0.2.44 10.0.0.1 12345 80\r\n"),
		[]byte("PROXY UNKNOWN\r\n"),
		v2(0x21, 0x11, v2IPv4...),
		v2(0x21, 0x21, append(append([]byte{}, v2IPv6...), 0x04, 0, 1, 'x')...),
	} {
		for i := 0; i < len(full); i++ {
			if _, _, err := Parse(full[:i]); err != ErrIncomplete {
				t.Fatalf("%q[:%d]: %v, want ErrIncomplete", full, i, err)
			}
		}
		if _, n, err := Parse(full); err != nil || n != len(full) {
			t.Fatalf("%q: %d bytes, %v", full, n, err)
		}
	}
}

// What Append writes, Parse reads back.
func TestParseAppendRoundTrip(t *testing.T) {
	for _, pair := range [][2]string{
		{"192.0.2.44:1", "10.0.0.1:65535"},
		{"[2001:db8::1]:8080", "[2001:db8::2]:443"},
	} {
		src, dst := netip.MustParseAddrPort(pair[0]), netip.MustParseAddrPort(pair[1])
		for _, v := range []Version{V1, V2} {
			b := Append(nil, v, src, dst)
			h, n, err := Parse(b)
			if err != nil || n != len(b) || h.Src != src || h.Dst != dst || h.Version != v || h.Local {
				t.Errorf("%v %v->%v: %+v, %d of %d bytes, %v", v, src, dst, h, n, len(b), err)
			}
		}
	}
	b := Append(nil, V2, netip.AddrPort{}, netip.AddrPort{})
	if h, _, err := Parse(b); err != nil || !h.Local {
		t.Errorf("v2 unknown: %+v, %v; want Local", h, err)
	}
	b = Append(nil, V1, netip.AddrPort{}, netip.AddrPort{})
	if h, _, err := Parse(b); err != nil || !h.Local {
		t.Errorf("v1 unknown: %+v, %v; want Local", h, err)
	}
}

func FuzzParse(f *testing.F) {
	f.Add([]byte("PROXY TCP4 192.0.2.44 10.0.0.1 12345 80\r\n"))
	f.Add([]byte("PROXY TCP6 2001:db8::1 2001:db8::2 8080 443\r\nGET"))
	f.Add([]byte("PROXY UNKNOWN\r\n"))
	f.Add(v2(0x21, 0x11, v2IPv4...))
	f.Add(v2(0x20, 0x00))
	f.Add(v2(0x21, 0x21, append(append([]byte{}, v2IPv6...), 0x04, 0, 1, 'x')...))
	f.Fuzz(func(t *testing.T, b []byte) {
		h, n, err := Parse(b)
		if err != nil {
			if n != 0 {
				t.Fatalf("error %v with %d bytes", err, n)
			}
			return
		}
		if n <= 0 || n > len(b) || n > MaxV2Len {
			t.Fatalf("header of %d bytes in %d", n, len(b))
		}
		if !h.Local && (!h.Src.IsValid() || !h.Dst.IsValid()) {
			t.Fatalf("non-local header without addresses: %+v", h)
		}
		// The header alone parses the same: Parse reads nothing past it.
		if h2, n2, err := Parse(b[:n]); err != nil || h2 != h || n2 != n {
			t.Fatalf("header alone: %+v %d %v, want %+v %d", h2, n2, err, h, n)
		}
	})
}
