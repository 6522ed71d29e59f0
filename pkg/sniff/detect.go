// Package sniff classifies a connection by its first bytes (TLS
// ClientHello, HTTP/2 preface, HTTP/1.x, anything else) and reads the server
// name (SNI) and ALPN protocols of a TLS ClientHello without terminating TLS
// and without allocating.
//
// Detection leans towards HTTP/1.x when in doubt: a connection classified
// as HTTP/1.x goes through the proxy's strict parser (which rejects what is
// not well-formed), while anything else may be relayed unchanged to the
// service. So every first line that starts like an HTTP method (an
// upper-case token and a space) is HTTP/1.x, as is any line holding
// " HTTP/" after a token and a space; only input that cannot be the start
// of an HTTP/1.x request is Other.
package sniff

// Kind is what the first bytes of a connection are.
type Kind uint8

const (
	// NeedMore: the bytes so far are a prefix of more than one kind.
	NeedMore Kind = iota
	// HTTP1 is an HTTP/1.x request (or something only the HTTP/1.x parser
	// may judge).
	HTTP1
	// HTTP2 is the HTTP/2 connection preface (prior knowledge, h2c).
	HTTP2
	// TLS is a TLS handshake record carrying a ClientHello.
	TLS
	// Other is any other protocol (SSH, a database, random bytes).
	Other
)

var kindNames = [...]string{"need-more", "http1", "http2", "tls", "other"}

// String names the kind ("http1", "http2", "tls", "other", "need-more").
func (k Kind) String() string {
	if int(k) < len(kindNames) {
		return kindNames[k]
	}
	return "unknown"
}

// Preface is the HTTP/2 client connection preface (RFC 9113 3.4).
const Preface = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

// MaxMethod is the longest method Detect waits for: a longer run of token
// bytes without a space is handed to the HTTP/1.x parser to judge.
const MaxMethod = 32

// maxLineScan bounds the scan for " HTTP/" in a line whose first word is
// not an upper-case method: past it the input is HTTP/1.x (the parser
// answers 414 or 400).
const maxLineScan = 8 << 10

// Record-layer constants (RFC 8446 5.1).
const (
	recordHandshake   = 0x16
	handshakeClientHi = 0x01
	recordHeaderLen   = 5
	// MaxRecord is the largest TLSPlaintext fragment (2^14).
	MaxRecord = 1 << 14
)

// Detect classifies b, the first bytes a client sent. It returns NeedMore
// while b is too short to tell; the caller reads more (bounded by its
// header timeout and buffer) and calls again with the longer prefix. It
// does not allocate.
func Detect(b []byte) Kind {
	if len(b) == 0 {
		return NeedMore
	}
	switch b[0] {
	case recordHandshake:
		return detectTLS(b)
	case 'P':
		if k := detectPreface(b); k != HTTP1 {
			return k
		}
	case '\r', '\n':
		return HTTP1 // empty lines before a request: the parser decides
	}
	return detectHTTP1(b)
}

// detectTLS checks the record header and the handshake type.
func detectTLS(b []byte) Kind {
	if len(b) >= 2 && b[1] != 3 {
		return Other
	}
	if len(b) >= 3 && b[2] > 4 {
		return Other
	}
	if len(b) >= 5 {
		n := int(b[3])<<8 | int(b[4])
		if n == 0 || n > MaxRecord {
			return Other
		}
	}
	if len(b) >= 6 {
		if b[5] != handshakeClientHi {
			return Other
		}
		return TLS
	}
	return NeedMore
}

// detectPreface returns HTTP2 for the whole preface, NeedMore for a strict
// prefix of it, HTTP1 otherwise (a method starting with P).
func detectPreface(b []byte) Kind {
	n := min(len(b), len(Preface))
	if string(b[:n]) != Preface[:n] {
		return HTTP1
	}
	if n == len(Preface) {
		return HTTP2
	}
	return NeedMore
}

// detectHTTP1 decides between HTTP1 and Other on the first line.
func detectHTTP1(b []byte) Kind {
	upper := true
	i := 0
	for ; i < len(b) && b[i] != ' '; i++ {
		c := b[i]
		if !isTchar(c) {
			return Other
		}
		if !(c >= 'A' && c <= 'Z' || c == '-' || c == '_') {
			upper = false
		}
		if i >= MaxMethod {
			return HTTP1
		}
	}
	if i == len(b) {
		return NeedMore
	}
	if i == 0 {
		return Other // a line starting with a space
	}
	if upper {
		return HTTP1
	}
	// A mixed token (SSH's "SSH-2.0-..." banner): HTTP/1.x only if the
	// line names an HTTP version.
	for j := i + 1; j < len(b); j++ {
		if b[j] == '\n' {
			return Other
		}
		if b[j] == 'H' && j+5 <= len(b) && string(b[j-1:j+5]) == " HTTP/" {
			return HTTP1
		}
		if j >= maxLineScan {
			return HTTP1
		}
	}
	return NeedMore
}

// isTchar reports an RFC 9110 token character.
func isTchar(c byte) bool {
	switch {
	case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		return true
	}
	switch c {
	case '!', '#', '$', '%', '&', '\'', '*', '+', '-', '.', '^', '_', '`', '|', '~':
		return true
	}
	return false
}
