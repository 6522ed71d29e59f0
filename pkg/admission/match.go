package admission

import (
	"bytes"
	"net/netip"
)

// HeaderGetter looks up a request header by name, case-insensitively,
// without allocating. It returns the first value.
type HeaderGetter interface {
	HeaderValue(name string) ([]byte, bool)
}

// Request is what matching and templates see of an HTTP request. The byte
// slices alias the proxy's buffers and are only read.
type Request struct {
	Remote, Local netip.AddrPort // client, and original destination
	// Peer is the TCP peer when Remote is a client named by a trusted
	// forwarding header (Service.ClientAddress); zero when they are one.
	Peer    netip.AddrPort
	Method  []byte
	Host    []byte // Host header (or absolute-form authority), port allowed
	Path    []byte // request target up to '?', raw (not decoded)
	Query   []byte // after '?', raw
	Headers HeaderGetter
	// SNI and ALPN are set for a TLS passthrough connection (admitted
	// once, with no HTTP fields): the ClientHello's server name and the
	// client's most preferred ALPN protocol.
	SNI, ALPN []byte
}

// Match is a location's request predicate. Every set condition must hold;
// an empty Match matches everything.
type Match struct {
	Hosts      []string // lower-case; "*.example.com" matches subdomains
	Path       string   // exact path
	PathPrefix string
	Methods    []string          // upper-case tokens; any when empty
	Headers    []HeaderCondition // all must hold
	// SNI patterns (like Hosts) match a TLS passthrough connection's
	// server name; a location with them never matches an HTTP request.
	SNI []string
}

// HeaderCondition tests one request header.
type HeaderCondition struct {
	Name    string // lower-case
	Present bool   // true: header must be present; false: must be absent (when Value is unset)
	Value   string // exact value when HasValue
	// HasValue selects an exact-value test instead of a presence test.
	HasValue bool
}

// Match returns the first location of s that matches r, or nil when none
// does (the request is then unprotected). It does not allocate.
func (s *Service) Match(r *Request) *Location {
	for _, l := range s.Locations {
		if l.Match.matches(r) {
			return l
		}
	}
	return nil
}

func (m *Match) matches(r *Request) bool {
	if m.Path != "" && string(r.Path) != m.Path {
		return false
	}
	if m.PathPrefix != "" && !bytes.HasPrefix(r.Path, []byte(m.PathPrefix)) {
		return false
	}
	if len(m.Methods) > 0 {
		ok := false
		for _, meth := range m.Methods {
			if string(r.Method) == meth {
				ok = true
				break
			}
		}
		if !ok {
			return false
		}
	}
	if len(m.Hosts) > 0 && !matchHost(m.Hosts, hostOnly(r.Host)) {
		return false
	}
	if len(m.SNI) > 0 && !matchHost(m.SNI, r.SNI) {
		return false
	}
	for i := range m.Headers {
		hc := &m.Headers[i]
		var v []byte
		found := false
		if r.Headers != nil {
			v, found = r.Headers.HeaderValue(hc.Name)
		}
		switch {
		case hc.HasValue:
			if !found || string(v) != hc.Value {
				return false
			}
		case found != hc.Present:
			return false
		}
	}
	return true
}

// matchHost compares case-insensitively; a pattern "*.example.com" matches
// any name ending in ".example.com" (not example.com itself).
func matchHost(patterns []string, host []byte) bool {
	if len(host) > 0 && host[len(host)-1] == '.' {
		host = host[:len(host)-1]
	}
	for _, p := range patterns {
		if len(p) > 1 && p[0] == '*' {
			suf := p[1:] // ".example.com"
			if len(host) > len(suf) && equalFold(host[len(host)-len(suf):], suf) {
				return true
			}
			continue
		}
		if equalFold(host, p) {
			return true
		}
	}
	return false
}

// equalFold compares ASCII case-insensitively; p is already lower-case.
func equalFold(b []byte, p string) bool {
	if len(b) != len(p) {
		return false
	}
	for i := 0; i < len(b); i++ {
		c := b[i]
		if 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		if c != p[i] {
			return false
		}
	}
	return true
}

// NormalizePath appends the normalized form of an origin-form path to dst
// for matching and templates, without allocating when dst has room:
// percent-encoded unreserved characters (ALPHA DIGIT - . _ ~) are decoded,
// other escapes keep their encoding with upper-case hex, repeated slashes
// are merged, and "." and ".." segments are resolved (RFC 3986 5.2.4; ".."
// never climbs above "/"). So "/%61pi//v1/./x/../items" becomes
// "/api/v1/items". It returns dst unchanged and false when p does not start
// with '/' or holds a malformed escape.
func NormalizePath(dst, p []byte) ([]byte, bool) {
	base := len(dst)
	if len(p) == 0 || p[0] != '/' {
		return dst, false
	}
	i := 0
	for i < len(p) {
		for i < len(p) && p[i] == '/' {
			i++
		}
		seg := len(dst)
		dst = append(dst, '/')
		for i < len(p) && p[i] != '/' {
			c := p[i]
			if c != '%' {
				dst = append(dst, c)
				i++
				continue
			}
			if i+2 >= len(p) {
				return dst[:base], false
			}
			hi, ok1 := unhex(p[i+1])
			lo, ok2 := unhex(p[i+2])
			if !ok1 || !ok2 {
				return dst[:base], false
			}
			if b := hi<<4 | lo; unreserved(b) {
				dst = append(dst, b)
			} else {
				dst = append(dst, '%', upperHex[hi], upperHex[lo])
			}
			i += 3
		}
		s := dst[seg+1:]
		dot := len(s) == 1 && s[0] == '.'
		dotdot := len(s) == 2 && s[0] == '.' && s[1] == '.'
		if !dot && !dotdot {
			continue
		}
		dst = dst[:seg]
		if dotdot {
			if j := bytes.LastIndexByte(dst[base:], '/'); j >= 0 {
				dst = dst[:base+j]
			}
		}
		if i >= len(p) { // a trailing "." or ".." names a directory
			dst = append(dst, '/')
		}
	}
	if len(dst) == base {
		dst = append(dst, '/')
	}
	return dst, true
}

const upperHex = "0123456789ABCDEF"

func unhex(c byte) (byte, bool) {
	switch {
	case '0' <= c && c <= '9':
		return c - '0', true
	case 'a' <= c && c <= 'f':
		return c - 'a' + 10, true
	case 'A' <= c && c <= 'F':
		return c - 'A' + 10, true
	}
	return 0, false
}

func unreserved(c byte) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-' || c == '.' || c == '_' || c == '~'
}
