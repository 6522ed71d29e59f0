// Package proxyproto writes and reads PROXY protocol headers (version 1
// text, version 2 binary; haproxy.org/download/2.9/doc/proxy-protocol.txt),
// which tell a service the client's address and the original destination
// of a connection a balancer or proxy opened on the client's behalf.
//
// Append writes one into a caller's buffer, Parse reads one at the start
// of a caller's bytes; neither allocates, since both sit on the data path
// (one header per connection). (A general library such as
// github.com/pires/go-proxyproto builds each header in a fresh
// bytes.Buffer and parses through a bufio.Reader it owns; a header is a
// few fixed bytes that the proxy's own read buffer already holds.)
package proxyproto

import (
	"fmt"
	"net/netip"
	"strconv"
)

// Version selects the header format; None writes nothing.
type Version uint8

const (
	None Version = iota
	V1           // text: "PROXY TCP4 src dst sport dport\r\n"
	V2           // binary
)

// String is the policy spelling ("", "v1", "v2").
func (v Version) String() string {
	switch v {
	case V1:
		return "v1"
	case V2:
		return "v2"
	}
	return ""
}

// ParseVersion reads the policy spelling: "v1", "v2" (or "" for None).
func ParseVersion(s string) (Version, error) {
	switch s {
	case "":
		return None, nil
	case "v1":
		return V1, nil
	case "v2":
		return V2, nil
	}
	return None, fmt.Errorf("proxy_protocol %q: want v1 or v2", s)
}

// Signature starts every version 2 header.
const Signature = "\r\n\r\n\x00\r\nQUIT\n"

// MaxLen is the longest header Append writes (v1 with two IPv6 addresses:
// 104 bytes is the spec's bound; v2 with IPv6 is 52).
const MaxLen = 108

// Append appends the header of version v for a connection from src (the
// client) to dst (the address the client connected to) and returns the
// extended buffer. IPv4-mapped IPv6 addresses are written as IPv4; when
// one side is IPv4 and the other IPv6, the IPv4 one is written mapped
// (the spec wants one family per header). An IPv6 zone (fe80::1%eth0) is
// dropped: the header has no place for it. Invalid addresses write the
// header's "unknown" form (v1 "PROXY UNKNOWN", v2 LOCAL): the service then
// uses the connection's own addresses.
func Append(b []byte, v Version, src, dst netip.AddrPort) []byte {
	sa, da := src.Addr().Unmap().WithZone(""), dst.Addr().Unmap().WithZone("")
	known := sa.IsValid() && da.IsValid()
	if known && sa.Is4() != da.Is4() {
		sa, da = netip.AddrFrom16(sa.As16()), netip.AddrFrom16(da.As16())
	}
	switch v {
	case V1:
		if !known {
			return append(b, "PROXY UNKNOWN\r\n"...)
		}
		if sa.Is4() {
			b = append(b, "PROXY TCP4 "...)
		} else {
			b = append(b, "PROXY TCP6 "...)
		}
		b = sa.AppendTo(b)
		b = append(b, ' ')
		b = da.AppendTo(b)
		b = append(b, ' ')
		b = strconv.AppendUint(b, uint64(src.Port()), 10)
		b = append(b, ' ')
		b = strconv.AppendUint(b, uint64(dst.Port()), 10)
		return append(b, "\r\n"...)
	case V2:
		b = append(b, Signature...)
		if !known {
			return append(b, 0x20, 0x00, 0, 0) // LOCAL, UNSPEC, no addresses
		}
		if sa.Is4() {
			b = append(b, 0x21, 0x11, 0, 12) // PROXY, TCP over IPv4
			s4, d4 := sa.As4(), da.As4()
			b = append(b, s4[:]...)
			b = append(b, d4[:]...)
		} else {
			b = append(b, 0x21, 0x21, 0, 36) // PROXY, TCP over IPv6
			s16, d16 := sa.As16(), da.As16()
			b = append(b, s16[:]...)
			b = append(b, d16[:]...)
		}
		return append(b, byte(src.Port()>>8), byte(src.Port()), byte(dst.Port()>>8), byte(dst.Port()))
	}
	return b
}
