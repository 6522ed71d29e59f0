// Package sniff classifies a connection by its first bytes (TLS
// ClientHello, HTTP/2 preface, HTTP/1.x, anything else) and reads the server
// name (SNI) and ALPN protocols of a TLS ClientHello without terminating TLS
// and without allocating.
//
// Detection leans towards HTTP/1.x when in doubt: a connection classified
// as HTTP/1.x goes through the proxy's strict parser (which answers 400 to
// what is not well-formed), while anything else may be relayed unchanged,
// without admission, to a service that may parse leniently. So the first
// line is split into words the way the most lenient servers split it: on
// any whitespace (SP, HTAB, VT, FF, CR, and 0x1c-0x1f, 0x85, 0xa0, which
// Python's http.server splits on too), leading whitespace skipped. It is
// HTTP/1.x when
//   - it is blank, or longer than 8 KiB, or its first word is a run of
//     more than MaxMethod token bytes;
//   - its first word is an upper-case token (A-Z, '-', '_': a method) and
//     a second word follows;
//   - its second word, or any later one, starts with '/' or '*' (an
//     origin-form or asterisk-form target), or the line holds "://" (an
//     absolute-form target) or "HTTP/" in any case (a version).
//
// It is Other when its first word holds a byte that is not a token
// character (binary data), when the line has one word only (Redis's
// "PING", "SSH-2.0-OpenSSH_9.2p1"), and when a first word that is not
// upper-case (SSH's banner "SSH-2.0-OpenSSH_9.2p1 Debian-2+deb12u3") is
// followed by none of the above before the line ends or a control byte
// (other than whitespace) shows binary data. A request line that a server
// could take goes to Other only with a method that is not upper-case and a
// relative target without '/' ("get admin", HTTP/0.9, or cut by a control
// byte before its version), which no common server dispatches.
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

// detectHTTP1 decides between HTTP1 and Other on the first line, split
// into words the way the most lenient servers split it (see the package
// doc for the rule).
func detectHTTP1(b []byte) Kind {
	i := skipSpace(b, 0)
	switch {
	case i >= maxLineScan:
		return HTTP1
	case i == len(b):
		return NeedMore
	case b[i] == '\n':
		return HTTP1 // a blank line: the parser decides
	}
	// The first word: every server's method is a token.
	start, upper := i, true
	for ; i < len(b) && !isSpace(b[i]) && b[i] != '\n'; i++ {
		c := b[i]
		if !isTchar(c) {
			return Other
		}
		if !(c >= 'A' && c <= 'Z' || c == '-' || c == '_') {
			upper = false
		}
		if i-start >= MaxMethod {
			return HTTP1
		}
	}
	// Whitespace, then the second word (a request's target).
	i = skipSpace(b, i)
	switch {
	case i >= maxLineScan:
		return HTTP1
	case i == len(b):
		return NeedMore
	case b[i] == '\n':
		return Other // a line of one word names no target: PING, an SSH banner
	case upper, b[i] == '/', b[i] == '*':
		return HTTP1
	}
	return scanLine(b, i)
}

// scanLine reads on through a line whose first word is a mixed token
// (SSH's "SSH-2.0-..." banner) and whose second word, at b[i], starts with
// neither '/' nor '*': it is HTTP/1.x when a later word starts with '/'
// or '*', or the line holds "://" (an absolute URI) or "HTTP/" in any
// case; Other at the line's end or at a control byte (binary data).
func scanLine(b []byte, i int) Kind {
	for ; i < len(b); i++ {
		if i >= maxLineScan {
			return HTTP1
		}
		switch c := b[i]; {
		case c == '\n':
			return Other
		case c == '/':
			if isSpace(b[i-1]) || b[i-1] == '/' && b[i-2] == ':' || endsWithHTTP(b[:i]) {
				return HTTP1
			}
		case c == '*' && isSpace(b[i-1]):
			return HTTP1
		case c < 0x20 && !isSpace(c), c == 0x7f:
			return Other
		}
	}
	return NeedMore
}

// endsWithHTTP reports whether b ends with "HTTP", in any case.
func endsWithHTTP(b []byte) bool {
	n := len(b)
	return n >= 4 && b[n-4]|0x20 == 'h' && b[n-3]|0x20 == 't' && b[n-2]|0x20 == 't' && b[n-1]|0x20 == 'p'
}

// skipSpace returns the index of the first byte at or after i that is not
// whitespace (isSpace), at most maxLineScan.
func skipSpace(b []byte, i int) int {
	for i < len(b) && i < maxLineScan && isSpace(b[i]) {
		i++
	}
	return i
}

// isSpace reports a byte some HTTP/1.x server splits a request line on:
// SP, HTAB, VT, FF and CR (a CR before the line's LF ends it), and the
// other bytes Python's str.split() treats as whitespace in a line decoded
// as ISO-8859-1 (0x1c-0x1f, 0x85, 0xa0; http.server splits on them). LF
// ends the line and is not in the set.
func isSpace(c byte) bool {
	switch c {
	case ' ', '\t', '\v', '\f', '\r', 0x1c, 0x1d, 0x1e, 0x1f, 0x85, 0xa0:
		return true
	}
	return false
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
