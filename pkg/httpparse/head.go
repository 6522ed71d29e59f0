// Package httpparse parses HTTP/1.1 request and response heads and chunked
// bodies strictly and without allocating, so a proxy can reject anything
// ambiguous before an unchanged backend ever sees it.
//
// Parsers work on a caller-owned byte slice and return fields as sub-slices
// of it; they are incremental in the sense that an incomplete but so far
// valid head yields ErrNeedMore (call again with more bytes), while limits
// are enforced on incomplete input too. Every strictness rule has its own
// *Error value carrying the HTTP status to answer. See docs/http.md.
package httpparse

import (
	"bytes"
	"encoding/binary"
	"math"
)

// Default limits (used for zero Limits fields).
const (
	DefaultMaxRequestLine = 8 << 10
	DefaultMaxHeaderBytes = 16 << 10
	DefaultMaxHeaders     = 100
	// MaxChunkLine bounds a chunk-size line including extensions (excl.
	// CRLF); net/http accepts at most 4095 bytes as well.
	MaxChunkLine = 4095
	// MaxChunkOverhead bounds accumulated chunk framing not paid for by data.
	MaxChunkOverhead = 16 << 10
)

// Header is one field line; Name and Value (OWS-trimmed) are slices into the
// parsed buffer.
type Header struct{ Name, Value []byte }

// Limits bound what a parser accepts. Zero fields take the defaults.
//
// MaxRequestLine bounds the request line (or status line) without its CRLF.
// MaxHeaderBytes bounds the whole head: start line, fields and the final
// empty line. MaxHeaders bounds the number of field lines (also for trailers).
type Limits struct{ MaxRequestLine, MaxHeaderBytes, MaxHeaders int }

func (l Limits) norm() Limits {
	if l.MaxRequestLine <= 0 {
		l.MaxRequestLine = DefaultMaxRequestLine
	}
	if l.MaxHeaderBytes <= 0 {
		l.MaxHeaderBytes = DefaultMaxHeaderBytes
	}
	if l.MaxHeaders <= 0 {
		l.MaxHeaders = DefaultMaxHeaders
	}
	return l
}

// BodyMode is how a message body is delimited.
type BodyMode uint8

const (
	BodyNone    BodyMode = iota // no body at all
	BodyLength                  // exactly ContentLength bytes (may be 0)
	BodyChunked                 // chunked transfer coding; use ChunkedDecoder
	BodyClose                   // response only: body ends when the connection closes
)

func (m BodyMode) String() string {
	switch m {
	case BodyNone:
		return "none"
	case BodyLength:
		return "length"
	case BodyChunked:
		return "chunked"
	case BodyClose:
		return "close"
	}
	return "invalid"
}

// facts are collected while reading field lines.
type facts struct {
	clRaw      []byte
	cl         int64
	hasCL      bool
	chunked    bool
	hasTE      bool
	host       []byte
	hostCount  int
	close      bool // Connection: close
	keepAlive  bool // Connection: keep-alive
	connUpg    bool // Connection: upgrade
	connOpts   int  // options listed by all Connection fields
	hasUpgrade bool // Upgrade field present
	expect100  bool
}

// MaxConnectionOptions bounds the options all Connection fields of a head
// list together (close, keep-alive and the names of fields to drop). A
// proxy drops every field a Connection option names, which costs a
// comparison per field and option; legitimate senders list one to three.
const MaxConnectionOptions = 16

// connection notes the options of one Connection field value (empty list
// elements and OWS ignored, as TokenListContains).
func (f *facts) connection(v []byte) error {
	for len(v) > 0 {
		var o []byte
		if o, v = nextElem(v); len(o) == 0 {
			continue
		}
		f.connOpts++
		if f.connOpts > MaxConnectionOptions {
			return ErrConnectionOptions
		}
		switch {
		case EqualFold(o, "close"):
			f.close = true
		case EqualFold(o, "keep-alive"):
			f.keepAlive = true
		case EqualFold(o, "upgrade"):
			f.connUpg = true
		}
	}
	return nil
}

// classify maps an unexpected byte to its specific rule, or def.
func classify(b byte, def *Error) *Error {
	switch b {
	case 0:
		return ErrNUL
	case '\r':
		return ErrBareCR
	case '\n':
		return ErrBareLF
	}
	return def
}

// startLine finds the first line of buf within max bytes (excl. CRLF). It
// returns the line without CRLF and the offset after its LF.
func startLine(buf []byte, max int) ([]byte, int, error) {
	w := len(buf)
	if w > max+2 {
		w = max + 2
	}
	lf := bytes.IndexByte(buf[:w], '\n')
	if lf < 0 {
		if len(buf) >= max+2 || len(buf) == max+1 && buf[max] != '\r' {
			return nil, 0, ErrRequestLineTooLong
		}
		return nil, 0, ErrNeedMore
	}
	if lf == 0 || buf[lf-1] != '\r' {
		if lf > max {
			return nil, 0, ErrRequestLineTooLong
		}
		return nil, 0, ErrBareLF
	}
	if lf-1 > max {
		return nil, 0, ErrRequestLineTooLong
	}
	return buf[:lf-1], lf + 1, nil
}

// headEnded reports whether buf holds a line terminator followed by an empty
// line ("\n\r\n" or "\n\n"), i.e. whether a head that starts at buf[0]
// might be complete. It is the cheap test that lets Parse answer ErrNeedMore
// without validating anything when it is called after every read; full
// validation runs once the head is complete or a limit is reached.
func headEnded(buf []byte) bool {
	i := 0
	for {
		k := bytes.IndexByte(buf[i:], '\n')
		if k < 0 {
			return false
		}
		i += k + 1
		if i < len(buf) && buf[i] == '\n' || i+1 < len(buf) && buf[i] == '\r' && buf[i+1] == '\n' {
			return true
		}
	}
}

var crlfcrlf = []byte("\r\n\r\n")

// needMore is the fast path shared by Request.Parse and Response.Parse: an
// incomplete head within MaxHeaderBytes is ErrNeedMore unless its start line
// already exceeds its limit (errStart).
func needMore(buf []byte, lim Limits, errStart error) error {
	if len(buf) >= lim.MaxHeaderBytes || bytes.HasSuffix(buf, crlfcrlf) || headEnded(buf) {
		return nil // complete (the common case: nothing after the head) or at the limit
	}
	if _, _, err := startLine(buf, lim.MaxRequestLine); err == ErrRequestLineTooLong {
		return errStart
	}
	return ErrNeedMore
}

// parseVersion parses exactly "HTTP/1.0" or "HTTP/1.1" and returns the minor.
func parseVersion(v []byte) (int, error) {
	if len(v) != 8 || v[0] != 'H' || v[1] != 'T' || v[2] != 'T' || v[3] != 'P' || v[4] != '/' ||
		v[5] < '0' || v[5] > '9' || v[6] != '.' || v[7] < '0' || v[7] > '9' {
		for _, b := range v {
			if e := classify(b, nil); e != nil {
				return 0, e
			}
		}
		return 0, ErrBadVersion
	}
	if v[5] != '1' || v[7] > '1' {
		return 0, ErrVersionUnsupported
	}
	return int(v[7] - '0'), nil
}

// parseFields reads field lines starting at pos until the empty line and
// returns the head length. Headers are appended to *hs. A nil f (trailers)
// skips the framing facts.
func parseFields(buf []byte, pos int, lim Limits, hs *[]Header, f *facts, isReq bool, minor int) (int, error) {
	end := len(buf)
	if end > lim.MaxHeaderBytes {
		end = lim.MaxHeaderBytes
	}
	n := 0
	for {
		if pos > end {
			return 0, ErrHeaderTooBig
		}
		i := bytes.IndexByte(buf[pos:end], '\n')
		if i < 0 {
			if len(buf) >= lim.MaxHeaderBytes {
				return 0, ErrHeaderTooBig
			}
			return 0, ErrNeedMore
		}
		line := buf[pos : pos+i]
		next := pos + i + 1
		if i == 0 || line[i-1] != '\r' {
			return 0, ErrBareLF
		}
		line = line[:i-1]
		if len(line) == 0 {
			return next, nil
		}
		if isOWS(line[0]) {
			return 0, ErrObsFold
		}
		if n == lim.MaxHeaders {
			return 0, ErrTooManyHeaders
		}
		n++
		name, value, err := splitField(line)
		if err != nil {
			return 0, err
		}
		*hs = append(*hs, Header{Name: name, Value: value})
		if f != nil {
			if err := f.field(name, value, isReq, minor); err != nil {
				return 0, err
			}
		}
		pos = next
	}
}

// splitField validates one field line (without CRLF) and splits it.
func splitField(line []byte) (name, value []byte, err error) {
	j := 0
	for j < len(line) && class[line[j]]&cToken != 0 {
		j++
	}
	if j == len(line) {
		return nil, nil, ErrMissingColon
	}
	if line[j] != ':' {
		if isOWS(line[j]) {
			k := j
			for k < len(line) && isOWS(line[k]) {
				k++
			}
			if k < len(line) && line[k] == ':' {
				return nil, nil, ErrSpaceBeforeColon
			}
			if k == len(line) {
				return nil, nil, ErrMissingColon
			}
			return nil, nil, classify(line[k], ErrBadHeaderName)
		}
		return nil, nil, classify(line[j], ErrBadHeaderName)
	}
	if j == 0 {
		return nil, nil, ErrBadHeaderName
	}
	name = line[:j]
	v := line[j+1:]
	if k := invalidValueByte(v); k >= 0 {
		return nil, nil, classify(v[k], ErrBadHeaderValue)
	}
	return name, trimOWS(v), nil
}

const (
	lsb = 0x0101010101010101
	msb = 0x8080808080808080
)

// invalidValueByte returns the index of the first byte of v that may not
// appear in a field value (a control byte other than HTAB, or DEL), or -1.
// It checks eight bytes at a time: a word with no byte below 0x20 and no
// 0x7F is valid as a whole (obs-text bytes have the high bit set and are
// never flagged); otherwise it falls back to the table.
func invalidValueByte(v []byte) int {
	i := 0
	for ; i+8 <= len(v); i += 8 {
		w := binary.LittleEndian.Uint64(v[i:])
		below := (w - 0x20*lsb) &^ w & msb
		x := w ^ (0x7f * lsb)
		del := (x - lsb) &^ x & msb
		if below|del != 0 {
			break
		}
	}
	for ; i < len(v); i++ {
		if class[v[i]]&cValue == 0 {
			return i
		}
	}
	return -1
}

// field records the framing facts a known field carries.
func (f *facts) field(name, v []byte, isReq bool, minor int) error {
	switch len(name) {
	case 4:
		if isReq && EqualFold(name, "host") {
			f.hostCount++
			if f.hostCount > 1 {
				return ErrRepeatedHost
			}
			if len(v) > 0 && !validAuthority(v, false) {
				return ErrBadHost
			}
			f.host = v
		}
	case 6:
		if isReq && minor == 1 && EqualFold(name, "expect") {
			if !EqualFold(v, "100-continue") {
				return ErrExpectUnsupported
			}
			f.expect100 = true
		}
	case 7:
		if EqualFold(name, "upgrade") {
			f.hasUpgrade = true
		}
	case 10:
		if EqualFold(name, "connection") {
			return f.connection(v)
		}
	case 14:
		if EqualFold(name, "content-length") {
			n, err := parseContentLength(v)
			if err != nil {
				return err
			}
			if f.hasCL && !bytes.Equal(f.clRaw, v) {
				return ErrConflictingLength
			}
			f.hasCL, f.cl, f.clRaw = true, n, v
		}
	case 17:
		if EqualFold(name, "transfer-encoding") {
			if minor == 0 {
				return ErrTEHTTP10
			}
			if f.hasTE {
				return ErrTERepeated
			}
			f.hasTE = true
			if !EqualFold(v, "chunked") {
				return ErrTEUnsupported
			}
			f.chunked = true
		}
	}
	return nil
}

// parseContentLength accepts 1*DIGIT that fits an int64.
func parseContentLength(v []byte) (int64, error) {
	if len(v) == 0 {
		return 0, ErrBadContentLength
	}
	var n int64
	over := false
	for _, b := range v {
		if b < '0' || b > '9' {
			return 0, ErrBadContentLength
		}
		d := int64(b - '0')
		if n > (math.MaxInt64-d)/10 {
			over = true
		}
		if !over {
			n = n*10 + d
		}
	}
	if over {
		return 0, ErrContentLengthOverflow
	}
	return n, nil
}

// validAuthority checks host [":" port] (reg-name, IPv4 or [IPv6]); no
// userinfo, no percent-encoding. requirePort demands a non-empty port.
func validAuthority(a []byte, requirePort bool) bool {
	if len(a) == 0 {
		return false
	}
	var rest []byte
	if a[0] == '[' {
		k := bytes.IndexByte(a, ']')
		if k < 2 {
			return false
		}
		for _, b := range a[1:k] {
			if class[b]&cHex == 0 && b != ':' && b != '.' {
				return false
			}
		}
		rest = a[k+1:]
	} else {
		k := 0
		for k < len(a) && a[k] != ':' {
			b := a[k]
			if class[b]&cHost == 0 || b == '%' || b == '[' || b == ']' {
				return false
			}
			k++
		}
		if k == 0 {
			return false
		}
		rest = a[k:]
	}
	if len(rest) == 0 {
		return !requirePort
	}
	if rest[0] != ':' {
		return false
	}
	port := rest[1:]
	if len(port) == 0 {
		return !requirePort
	}
	if len(port) > 5 {
		return false
	}
	for _, b := range port {
		if b < '0' || b > '9' {
			return false
		}
	}
	return true
}
