package exchange

import "net/netip"

// The header rules every HTTP path applies to what it forwards. Each path
// applies them in its own representation (the HTTP/1.1 loops to header
// bytes, the HTTP/2 path to an http.Header); the tables and predicates
// here say what the rules are.

// HopByHop are the connection-specific fields of RFC 9110 7.6.1, in
// canonical form (http.Header keys): no path forwards them, in either
// direction, nor the fields a message's Connection field names.
var HopByHop = [...]string{"Connection", "Keep-Alive", "Proxy-Connection", "Te", "Trailer", "Transfer-Encoding", "Upgrade"}

// HTTP2Settings is the field of an h2c upgrade (RFC 9113 3.2; RFC 7540
// 3.2.1 makes it connection-specific). The proxy never performs that
// upgrade, so no path forwards the field in a request.
const HTTP2Settings = "Http2-Settings"

// IsHopByHop reports whether name (in any case) is one of HopByHop. It
// does not allocate.
func IsHopByHop[S ~string | ~[]byte](name S) bool {
	switch len(name) {
	case 2:
		return foldEq(name, "te")
	case 7:
		return foldEq(name, "trailer") || foldEq(name, "upgrade")
	case 10:
		return foldEq(name, "connection") || foldEq(name, "keep-alive")
	case 16:
		return foldEq(name, "proxy-connection")
	case 17:
		return foldEq(name, "transfer-encoding")
	}
	return false
}

// IsHTTP2Settings reports whether name (in any case) is HTTP2Settings.
func IsHTTP2Settings[S ~string | ~[]byte](name S) bool {
	return len(name) == len(HTTP2Settings) && foldEq(name, "http2-settings")
}

// ForwardField is a forwarding field a service adds to the requests it
// sends upstream (Service.XForwardedFor, XForwardedProto, Forwarded,
// XRealIP: the policy's forwarded_headers). The client's own field of
// that name never reaches the upstream as it came: a list field
// (AppendsPrior) keeps the client's values and gets the proxy's element
// appended, any other is replaced.
type ForwardField uint8

// The forwarding fields.
const (
	FieldXForwardedFor ForwardField = iota + 1
	FieldXForwardedProto
	FieldForwarded
	FieldXRealIP
)

// ForwardFields lists the forwarding fields in the order the HTTP/1.1
// path writes them.
var ForwardFields = [...]ForwardField{FieldXForwardedFor, FieldXForwardedProto, FieldForwarded, FieldXRealIP}

// ForwardedProto is the scheme the forwarding fields name: clients reach
// the proxy in cleartext (TLS is passed through, never terminated).
const ForwardedProto = "http"

var forwardNames = [...]string{"", "X-Forwarded-For", "X-Forwarded-Proto", "Forwarded", "X-Real-IP"}
var forwardKeys = [...]string{"", "X-Forwarded-For", "X-Forwarded-Proto", "Forwarded", "X-Real-Ip"}

// Name is f's name as the HTTP/1.1 path writes it ("" for no field).
func (f ForwardField) Name() string {
	if int(f) >= len(forwardNames) {
		return ""
	}
	return forwardNames[f]
}

// Key is f's name in canonical form (its http.Header key).
func (f ForwardField) Key() string {
	if int(f) >= len(forwardKeys) {
		return ""
	}
	return forwardKeys[f]
}

func (f ForwardField) String() string { return f.Name() }

// AppendsPrior reports whether f is a list of hops (X-Forwarded-For,
// Forwarded): the client's values stay, joined by ", ", and the proxy's
// element goes last. X-Forwarded-Proto and X-Real-IP are replaced.
func (f ForwardField) AppendsPrior() bool { return f == FieldXForwardedFor || f == FieldForwarded }

// ForwardFieldOf reports which forwarding field name (in any case) is; 0
// when none. It does not allocate.
func ForwardFieldOf[S ~string | ~[]byte](name S) ForwardField {
	switch len(name) {
	case 9:
		switch {
		case foldEq(name, "forwarded"):
			return FieldForwarded
		case foldEq(name, "x-real-ip"):
			return FieldXRealIP
		}
	case 15:
		if foldEq(name, "x-forwarded-for") {
			return FieldXForwardedFor
		}
	case 17:
		if foldEq(name, "x-forwarded-proto") {
			return FieldXForwardedProto
		}
	}
	return 0
}

// Adds reports whether s adds f to the requests it sends upstream.
func (s *Service) Adds(f ForwardField) bool {
	switch f {
	case FieldXForwardedFor:
		return s.XForwardedFor
	case FieldXForwardedProto:
		return s.XForwardedProto
	case FieldForwarded:
		return s.Forwarded
	case FieldXRealIP:
		return s.XRealIP
	}
	return false
}

// AddsForwarding reports whether s adds any forwarding field.
func (s *Service) AddsForwarding() bool {
	return s.XForwardedFor || s.XForwardedProto || s.Forwarded || s.XRealIP
}

// AppendValue appends the proxy's element of f for a request from client
// (Request.Remote's address: the client a trusted peer named under the
// service's client_address, else the TCP peer): the address for
// X-Forwarded-For and X-Real-IP, ForwardedProto for X-Forwarded-Proto,
// and for Forwarded an RFC 7239 element "for=ADDR;proto=http" with an
// IPv6 address quoted in brackets. An IPv4-mapped IPv6 address is
// written as IPv4. It does not allocate when b has room.
func (f ForwardField) AppendValue(b []byte, client netip.Addr) []byte {
	ip := client.Unmap()
	switch f {
	case FieldXForwardedFor, FieldXRealIP:
		return ip.AppendTo(b)
	case FieldXForwardedProto:
		return append(b, ForwardedProto...)
	case FieldForwarded:
		b = append(b, "for="...)
		if ip.Is6() {
			b = append(b, `"[`...)
			b = ip.AppendTo(b)
			b = append(b, `]"`...)
		} else {
			b = ip.AppendTo(b)
		}
		return append(b, ";proto="+ForwardedProto...)
	}
	return b
}

// foldEq reports whether a equals lower, an ASCII lower-case string of
// the same length, ignoring ASCII case.
func foldEq[S ~string | ~[]byte](a S, lower string) bool {
	if len(a) != len(lower) {
		return false
	}
	for i := range len(a) {
		c := a[i]
		if 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		if c != lower[i] {
			return false
		}
	}
	return true
}
