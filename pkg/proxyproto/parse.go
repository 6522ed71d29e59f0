package proxyproto

import (
	"bytes"
	"errors"
	"net/netip"
	"unsafe"
)

// Header is what a PROXY header a peer sent says about its connection.
type Header struct {
	Version Version
	// Local is set for v1 "UNKNOWN", v2 LOCAL and v2 UNSPEC: the header
	// names no client, and the connection's own addresses stand.
	Local bool
	// Src is the client, Dst the address it connected to (zero when
	// Local).
	Src, Dst netip.AddrPort
}

// MaxV2Len bounds what Parse accepts of a version 2 header (16 fixed
// bytes, the addresses and the TLVs): the spec allows 64 KiB, and a
// header this long is a peer wasting the proxy's memory, not a
// balancer's (HAProxy and AWS NLB send well under 300 bytes).
const MaxV2Len = 1024

// maxV1Len is the spec's bound on a version 1 line, CRLF included.
const maxV1Len = 107

// Parse errors. ErrIncomplete asks for more bytes; every other error is
// final: the connection is not one a PROXY header should have started.
var (
	ErrIncomplete = errors.New("proxyproto: header incomplete")
	ErrNotProxy   = errors.New("proxyproto: no PROXY header")
	ErrV1Syntax   = errors.New("proxyproto: malformed v1 header")
	ErrV1TooLong  = errors.New("proxyproto: v1 header without CRLF within 107 bytes")
	ErrV2Command  = errors.New("proxyproto: v2 header with an unknown version or command")
	ErrV2Family   = errors.New("proxyproto: v2 header for a family or protocol other than TCP over IPv4/IPv6")
	ErrV2Length   = errors.New("proxyproto: v2 header length too short for its addresses")
	ErrV2TooLong  = errors.New("proxyproto: v2 header longer than MaxV2Len")
	ErrV2TLV      = errors.New("proxyproto: malformed v2 TLV")
)

const v1Prefix = "PROXY "

// Parse reads a PROXY header (version 1 or 2) at the start of b and
// returns it with its length in bytes. With ErrIncomplete, b is a valid
// beginning of a header and the caller reads more (bounded by its header
// timeout and MaxV2Len / 107 bytes); ErrNotProxy says b starts with
// something else. Parse is strict: v1 with single spaces, addresses of
// the family it names, decimal ports without sign or leading zero, CRLF;
// v2 with version 2, command LOCAL or PROXY, TCP over IPv4 or IPv6 (or
// UNSPEC), a length that holds its addresses, and well-formed TLVs
// (read, not kept). It does not allocate.
func Parse(b []byte) (Header, int, error) {
	switch {
	case len(b) == 0:
		return Header{}, 0, ErrIncomplete
	case b[0] == Signature[0]:
		return parseV2(b)
	case b[0] == v1Prefix[0]:
		return parseV1(b)
	}
	return Header{}, 0, ErrNotProxy
}

func parseV1(b []byte) (Header, int, error) {
	n := min(len(b), len(v1Prefix))
	if string(b[:n]) != v1Prefix[:n] {
		return Header{}, 0, ErrNotProxy
	}
	end := -1
	for i := 0; i < len(b) && i < maxV1Len; i++ {
		if b[i] == '\n' {
			if i == 0 || b[i-1] != '\r' {
				return Header{}, 0, ErrV1Syntax // bare LF
			}
			end = i + 1
			break
		}
	}
	if end < 0 {
		if len(b) >= maxV1Len {
			return Header{}, 0, ErrV1TooLong
		}
		return Header{}, 0, ErrIncomplete
	}
	line := b[len(v1Prefix) : end-2]
	h := Header{Version: V1}
	proto, rest, ok := cut(line)
	if string(proto) == "UNKNOWN" {
		// The spec lets the sender put anything after UNKNOWN; the
		// receiver ignores it.
		h.Local = true
		return h, end, nil
	}
	var is4 bool
	switch string(proto) {
	case "TCP4":
		is4 = true
	case "TCP6":
	default:
		return Header{}, 0, ErrV1Syntax
	}
	if !ok {
		return Header{}, 0, ErrV1Syntax
	}
	srcS, rest, ok1 := cut(rest)
	dstS, rest, ok2 := cut(rest)
	spS, dpS, ok3 := cut(rest)
	if !ok1 || !ok2 || !ok3 {
		return Header{}, 0, ErrV1Syntax
	}
	src, ok1 := parseAddr(srcS, is4)
	dst, ok2 := parseAddr(dstS, is4)
	sp, ok3 := parsePort(spS)
	dp, ok4 := parsePort(dpS)
	if !ok1 || !ok2 || !ok3 || !ok4 {
		return Header{}, 0, ErrV1Syntax
	}
	h.Src, h.Dst = netip.AddrPortFrom(src, sp), netip.AddrPortFrom(dst, dp)
	return h, end, nil
}

// cut splits b at its first space; ok is false when there is none.
func cut(b []byte) (before, after []byte, ok bool) {
	for i, c := range b {
		if c == ' ' {
			return b[:i], b[i+1:], true
		}
	}
	return b, nil, false
}

// parseAddr reads a v1 address of the named family: dotted-quad IPv4, or
// IPv6 without a zone. The string shares b's bytes (netip.ParseAddr
// keeps nothing of an address without a zone, and a zone is refused
// before it is read), so parsing allocates nothing.
func parseAddr(b []byte, is4 bool) (netip.Addr, bool) {
	if len(b) == 0 || len(b) > 45 || bytes.IndexByte(b, '%') >= 0 {
		return netip.Addr{}, false
	}
	a, err := netip.ParseAddr(unsafe.String(&b[0], len(b)))
	if err != nil || a.Zone() != "" || a.Is4() != is4 {
		return netip.Addr{}, false
	}
	return a, true
}

// parsePort reads a decimal port, 0-65535, no sign, no leading zero.
func parsePort(b []byte) (uint16, bool) {
	if len(b) == 0 || len(b) > 5 || (len(b) > 1 && b[0] == '0') {
		return 0, false
	}
	n := 0
	for _, c := range b {
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + int(c-'0')
	}
	if n > 65535 {
		return 0, false
	}
	return uint16(n), true
}

func parseV2(b []byte) (Header, int, error) {
	n := min(len(b), len(Signature))
	if string(b[:n]) != Signature[:n] {
		return Header{}, 0, ErrNotProxy
	}
	if len(b) < 16 {
		return Header{}, 0, ErrIncomplete
	}
	verCmd, fam := b[12], b[13]
	size := 16 + (int(b[14])<<8 | int(b[15]))
	if verCmd>>4 != 2 || verCmd&0xf > 1 {
		return Header{}, 0, ErrV2Command
	}
	if size > MaxV2Len {
		return Header{}, 0, ErrV2TooLong
	}
	if len(b) < size {
		return Header{}, 0, ErrIncomplete
	}
	body := b[16:size]
	h := Header{Version: V2}
	var alen int
	switch fam {
	case 0x00: // UNSPEC: use the connection's addresses
		alen = 0
	case 0x11: // TCP over IPv4
		alen = 12
	case 0x21: // TCP over IPv6
		alen = 36
	default: // UDP, UNIX sockets, unknown families
		return Header{}, 0, ErrV2Family
	}
	if len(body) < alen {
		return Header{}, 0, ErrV2Length
	}
	if err := checkTLVs(body[alen:]); err != nil {
		return Header{}, 0, err
	}
	if verCmd&0xf == 0 || alen == 0 { // LOCAL, or PROXY over UNSPEC
		h.Local = true
		return h, size, nil
	}
	var src, dst netip.Addr
	if alen == 12 {
		src, dst = netip.AddrFrom4([4]byte(body[0:4])), netip.AddrFrom4([4]byte(body[4:8]))
	} else {
		src, dst = netip.AddrFrom16([16]byte(body[0:16])), netip.AddrFrom16([16]byte(body[16:32]))
	}
	ports := body[alen-4 : alen]
	h.Src = netip.AddrPortFrom(src, uint16(ports[0])<<8|uint16(ports[1]))
	h.Dst = netip.AddrPortFrom(dst, uint16(ports[2])<<8|uint16(ports[3]))
	return h, size, nil
}

// checkTLVs walks the type-length-value records after the addresses:
// each must fit what is left.
func checkTLVs(b []byte) error {
	for len(b) > 0 {
		if len(b) < 3 {
			return ErrV2TLV
		}
		l := 3 + (int(b[1])<<8 | int(b[2]))
		if l > len(b) {
			return ErrV2TLV
		}
		b = b[l:]
	}
	return nil
}
