// Package realip finds a request's client address behind trusted
// proxies: the rightmost address of X-Forwarded-For or of Forwarded's
// for= parameters (RFC 7239) that is not a trusted proxy, believed only
// when the connection's peer is trusted (nginx's realip module with
// real_ip_recursive on; Envoy's xff_num_trusted_hops counts instead).
//
// It reads header values in place and does not allocate: it runs once
// per request on the data path.
package realip

import (
	"bytes"
	"fmt"
	"net/netip"
	"unsafe"

	"github.com/rl-tproxy/rl-tproxy/pkg/httpparse"
)

// Trusted is a set of address prefixes whose hosts are believed when
// they name the client they forward for.
type Trusted struct {
	prefixes []netip.Prefix
}

// ParseTrusted reads CIDRs ("10.0.0.0/8", "2001:db8::/32") and single
// addresses ("192.0.2.7", taken as /32 or /128). An IPv4-mapped IPv6
// peer is matched as its IPv4 address.
func ParseTrusted(cidrs []string) (*Trusted, error) {
	t := &Trusted{}
	for _, s := range cidrs {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			a, aerr := netip.ParseAddr(s)
			if aerr != nil || a.Zone() != "" {
				return nil, fmt.Errorf("trusted %q: not a CIDR or an address", s)
			}
			p = netip.PrefixFrom(a, a.BitLen())
		}
		if p.Addr().Zone() != "" {
			return nil, fmt.Errorf("trusted %q: a zone has no place in a prefix", s)
		}
		if p != p.Masked() {
			return nil, fmt.Errorf("trusted %q: host bits set (did you mean %s?)", s, p.Masked())
		}
		if p.Addr().Is4In6() { // ::ffff:a.b.c.d/N: the IPv4 prefix it covers
			if p.Bits() < 96 {
				return nil, fmt.Errorf("trusted %q: an IPv4-mapped prefix shorter than /96 spans beyond IPv4", s)
			}
			p = netip.PrefixFrom(p.Addr().Unmap(), p.Bits()-96)
		}
		t.prefixes = append(t.prefixes, p)
	}
	return t, nil
}

// Contains reports whether a is inside a trusted prefix.
func (t *Trusted) Contains(a netip.Addr) bool {
	if t == nil {
		return false
	}
	a = a.Unmap().WithZone("")
	for _, p := range t.prefixes {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// Len is the number of prefixes.
func (t *Trusted) Len() int {
	if t == nil {
		return 0
	}
	return len(t.prefixes)
}

// maxHops bounds the elements of a list that is read: a longer chain is
// unreadable (and the caller keeps the peer).
const maxHops = 32

// FromXFF returns the client named by X-Forwarded-For values (each a
// field line's value, in the order they came; several lines read as one
// comma-joined list) when peer is trusted: walking from the right, the
// first address that is not trusted, or the leftmost when all are. ok is
// false, and the caller keeps the peer, when the peer is not trusted,
// there is no value, or the list is not plain IP addresses throughout
// (an empty element, "unknown", a port, garbage, more than 32 hops): a
// list that cannot be read whole is believed in no part.
func (t *Trusted) FromXFF(peer netip.Addr, values [][]byte) (client netip.Addr, ok bool) {
	if !t.Contains(peer) {
		return netip.Addr{}, false
	}
	var addrs [maxHops]netip.Addr
	n := 0
	for _, v := range values {
		for {
			j := bytes.IndexByte(v, ',')
			el := v
			if j >= 0 {
				el = v[:j]
			}
			a, ok := parseIP(trimOWS(el))
			if !ok || n == len(addrs) {
				return netip.Addr{}, false
			}
			addrs[n] = a
			n++
			if j < 0 {
				break
			}
			v = v[j+1:]
		}
	}
	return t.rightmostUntrusted(addrs[:n])
}

// rightmostUntrusted walks a hop list from the right: the first address
// not trusted, or the leftmost when all are.
func (t *Trusted) rightmostUntrusted(addrs []netip.Addr) (netip.Addr, bool) {
	if len(addrs) == 0 {
		return netip.Addr{}, false
	}
	for i := len(addrs) - 1; i >= 0; i-- {
		if !t.Contains(addrs[i]) {
			return addrs[i], true
		}
	}
	return addrs[0], true
}

// FromForwarded is FromXFF for Forwarded (RFC 7239) values: each
// comma-separated element's for= parameter, a token or a quoted string
// ("[2001:db8::1]:4711", "192.0.2.60:8080"; the port is dropped). An
// element without for=, or with an obfuscated or "unknown" node, makes
// the list unreadable, as does any syntax error.
func (t *Trusted) FromForwarded(peer netip.Addr, values [][]byte) (client netip.Addr, ok bool) {
	if !t.Contains(peer) {
		return netip.Addr{}, false
	}
	var addrs [maxHops]netip.Addr
	n := 0
	for _, v := range values {
		for len(v) > 0 {
			a, rest, ok := forwardedElement(v)
			if !ok || n == len(addrs) {
				return netip.Addr{}, false
			}
			addrs[n] = a
			n++
			v = rest
		}
	}
	return t.rightmostUntrusted(addrs[:n])
}

// forwardedElement reads one element (pairs separated by ';') up to the
// next top-level ',' and returns its for= address.
func forwardedElement(v []byte) (netip.Addr, []byte, bool) {
	var found netip.Addr
	have := false
	v = trimOWS(v)
	for {
		// name=value
		eq := bytes.IndexByte(v, '=')
		if eq <= 0 || !isToken(v[:eq]) {
			return netip.Addr{}, nil, false
		}
		name := v[:eq]
		v = v[eq+1:]
		var val []byte
		if len(v) > 0 && v[0] == '"' {
			end := 1
			for end < len(v) && v[end] != '"' {
				if v[end] == '\\' || v[end] < 0x20 || v[end] == 0x7f {
					return netip.Addr{}, nil, false // escapes never occur in an address
				}
				end++
			}
			if end == len(v) {
				return netip.Addr{}, nil, false
			}
			val, v = v[1:end], v[end+1:]
		} else {
			end := 0
			for end < len(v) && v[end] != ';' && v[end] != ',' && v[end] != ' ' && v[end] != '\t' {
				end++
			}
			val, v = v[:end], v[end:]
			if !isNodeChars(val) {
				return netip.Addr{}, nil, false
			}
		}
		if httpparse.EqualFold(name, "for") {
			if have {
				return netip.Addr{}, nil, false // two for= in one element
			}
			a, ok := forwardedNode(val)
			if !ok {
				return netip.Addr{}, nil, false
			}
			found, have = a, true
		}
		v = trimOWS(v)
		switch {
		case len(v) == 0:
			return found, nil, have
		case v[0] == ';':
			v = trimOWS(v[1:])
		case v[0] == ',':
			return found, v[1:], have
		default:
			return netip.Addr{}, nil, false
		}
	}
}

// forwardedNode reads a for= node: IPv4[:port] or "[IPv6]"[:port].
func forwardedNode(b []byte) (netip.Addr, bool) {
	if len(b) > 0 && b[0] == '[' {
		end := bytes.IndexByte(b, ']')
		if end < 0 {
			return netip.Addr{}, false
		}
		a, ok := parseIP(b[1:end])
		if !ok || !a.Is6() || !validPort(b[end+1:]) {
			return netip.Addr{}, false
		}
		return a, true
	}
	host := b
	if i := bytes.IndexByte(b, ':'); i >= 0 {
		host = b[:i]
		if !validPort(b[i:]) {
			return netip.Addr{}, false
		}
	}
	a, ok := parseIP(host)
	return a, ok && a.Is4()
}

// validPort accepts "" or ":" followed by 1-5 digits (RFC 7239 also
// allows obfuscated ports, "_abc"; the port is dropped either way).
func validPort(b []byte) bool {
	if len(b) == 0 {
		return true
	}
	if b[0] != ':' || len(b) < 2 {
		return false
	}
	for _, c := range b[1:] {
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c == '.' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

// parseIP reads a plain IP address (no zone) in place.
func parseIP(b []byte) (netip.Addr, bool) {
	if len(b) == 0 || len(b) > 45 || bytes.IndexByte(b, '%') >= 0 {
		return netip.Addr{}, false
	}
	// The string shares b's bytes: netip.ParseAddr keeps nothing of an
	// address without a zone.
	a, err := netip.ParseAddr(unsafe.String(&b[0], len(b)))
	if err != nil {
		return netip.Addr{}, false
	}
	return a.Unmap(), true
}

func trimOWS(b []byte) []byte {
	for len(b) > 0 && (b[0] == ' ' || b[0] == '\t') {
		b = b[1:]
	}
	for len(b) > 0 && (b[len(b)-1] == ' ' || b[len(b)-1] == '\t') {
		b = b[:len(b)-1]
	}
	return b
}

// isToken: RFC 9110 tchar throughout.
func isToken(b []byte) bool {
	if len(b) == 0 {
		return false
	}
	for _, c := range b {
		if !httpparse.IsTchar(c) {
			return false
		}
	}
	return true
}

// isNodeChars: an unquoted for= value. RFC 7239 wants a token (so a
// port or an IPv6 address quoted), and senders write 192.0.2.60:8080
// unquoted too; ':' '[' ']' are let through, forwardedNode judges.
func isNodeChars(b []byte) bool {
	if len(b) == 0 {
		return false
	}
	for _, c := range b {
		if !httpparse.IsTchar(c) && c != ':' && c != '[' && c != ']' {
			return false
		}
	}
	return true
}
