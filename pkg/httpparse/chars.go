package httpparse

import "bytes"

// Byte classes, one table lookup per byte on the hot path.
const (
	cToken  = 1 << iota // tchar (RFC 9110 5.6.2)
	cValue              // field-vchar, SP, HTAB (VCHAR / obs-text)
	cTarget             // byte allowed in a request-target (VCHAR except '#')
	cHost               // byte allowed in Host / authority (reg-name, IP-literal, port)
	cHex                // HEXDIG
)

var class = func() (t [256]uint8) {
	for c := 0; c < 256; c++ {
		b := byte(c)
		alnum := b >= '0' && b <= '9' || b >= 'a' && b <= 'z' || b >= 'A' && b <= 'Z'
		if alnum {
			t[c] |= cToken | cHost
		}
		switch b {
		case '!', '#', '$', '%', '&', '\'', '*', '+', '-', '.', '^', '_', '`', '|', '~':
			t[c] |= cToken
		}
		switch b {
		case '-', '.', '_', '~', '!', '$', '&', '\'', '(', ')', '*', '+', ',', ';', '=', '%', ':', '[', ']':
			t[c] |= cHost
		}
		if b >= 0x21 && b <= 0x7e || b >= 0x80 || b == ' ' || b == '\t' {
			t[c] |= cValue
		}
		if b >= 0x21 && b <= 0x7e && b != '#' {
			t[c] |= cTarget
		}
		if b >= '0' && b <= '9' || b >= 'a' && b <= 'f' || b >= 'A' && b <= 'F' {
			t[c] |= cHex
		}
	}
	return t
}()

func lower(b byte) byte {
	if b >= 'A' && b <= 'Z' {
		return b + ('a' - 'A')
	}
	return b
}

// IsTchar reports an RFC 9110 token character (tchar).
func IsTchar(c byte) bool { return class[c]&cToken != 0 }

// EqualFold reports whether b equals s under ASCII case folding, without
// allocating.
func EqualFold(b []byte, s string) bool {
	if len(b) != len(s) {
		return false
	}
	for i := 0; i < len(b); i++ {
		if lower(b[i]) != lower(s[i]) {
			return false
		}
	}
	return true
}

func isOWS(b byte) bool { return b == ' ' || b == '\t' }

func trimOWS(b []byte) []byte {
	for len(b) > 0 && isOWS(b[0]) {
		b = b[1:]
	}
	for len(b) > 0 && isOWS(b[len(b)-1]) {
		b = b[:len(b)-1]
	}
	return b
}

// TokenListContains reports whether the comma-separated list v (as in
// Connection or Upgrade) contains token, case-insensitively. Empty list
// elements and OWS around elements are ignored. It does not allocate.
func TokenListContains(v []byte, token string) bool {
	for len(v) > 0 {
		var e []byte
		e, v = nextElem(v)
		if EqualFold(e, token) {
			return true
		}
	}
	return false
}

// nextElem splits the first element off the comma-separated list v: the
// element with OWS trimmed (empty for an empty element) and the rest after
// its comma (nil after the last).
func nextElem(v []byte) (elem, rest []byte) {
	i := bytes.IndexByte(v, ',')
	if i < 0 {
		return trimOWS(v), nil
	}
	return trimOWS(v[:i]), v[i+1:]
}

// lookup returns the value of the first field named name (case-insensitive).
func lookup(hs []Header, name string) ([]byte, bool) {
	for i := range hs {
		if EqualFold(hs[i].Name, name) {
			return hs[i].Value, true
		}
	}
	return nil, false
}

// listHas reports whether any field named name carries token in its list.
func listHas(hs []Header, name, token string) bool {
	for i := range hs {
		if EqualFold(hs[i].Name, name) && TokenListContains(hs[i].Value, token) {
			return true
		}
	}
	return false
}

// ConnectionHas reports whether any Connection field of hs lists token
// (case-insensitive). A proxy uses it to drop the fields a Connection header
// names as hop-by-hop.
func ConnectionHas(hs []Header, token []byte) bool {
	for i := range hs {
		if !EqualFold(hs[i].Name, "connection") {
			continue
		}
		for v := hs[i].Value; len(v) > 0; {
			var e []byte
			e, v = nextElem(v)
			if EqualFoldBytes(e, token) {
				return true
			}
		}
	}
	return false
}

// ConnectionOptions appends to dst the options of every Connection field
// of hs (non-empty list elements, OWS trimmed) and reports whether they all
// fit in dst's capacity; it stops at the first that does not. A head Parse
// accepted lists at most MaxConnectionOptions. It does not allocate.
func ConnectionOptions(dst [][]byte, hs []Header) ([][]byte, bool) {
	for i := range hs {
		if !EqualFold(hs[i].Name, "connection") {
			continue
		}
		for v := hs[i].Value; len(v) > 0; {
			var o []byte
			if o, v = nextElem(v); len(o) == 0 {
				continue
			}
			if len(dst) == cap(dst) {
				return dst, false
			}
			dst = append(dst, o)
		}
	}
	return dst, true
}

// EqualFoldBytes reports whether a and b are equal under ASCII case
// folding (field names are ASCII tokens).
func EqualFoldBytes(a, b []byte) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if lower(a[i]) != lower(b[i]) {
			return false
		}
	}
	return true
}
