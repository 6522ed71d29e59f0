package httpparse

import "bytes"

const (
	stSize uint8 = iota
	stData
	stDataCR
	stDataLF
	stTrailer
	stDone
)

// ChunkedDecoder is a strict incremental decoder of the chunked transfer
// coding (RFC 9112 7.1). It never allocates except to grow Trailers, and it
// never copies body bytes: Decode hands back sub-slices of its input.
//
// Rules: the chunk size is 1 to 16 hex digits whose value fits an int64,
// followed directly by CRLF or by chunk extensions; an extension is
// ";" token [ "=" ( token / quoted-string ) ], repeated, with no whitespace
// anywhere (RFC 9112's BWS is rejected: parsers disagree about it); the size
// line is at most MaxChunkLine bytes; framing overhead beyond what the data
// pays for is bounded (ErrChunkOverhead, the same rule net/http applies); every chunk's data is followed by CRLF;
// trailer fields after the last chunk obey the same rules as header fields
// and Limits.MaxHeaderBytes / MaxHeaders (they are not interpreted: framing
// fields in trailers have no effect). The zero value is ready to use with
// default limits.
type ChunkedDecoder struct {
	Limits Limits // bounds for the trailer section; zero fields = defaults
	// Trailers holds the trailer fields once Done; slices point into the src
	// of the Decode call that finished the body.
	Trailers []Header

	state     uint8
	remaining int64
	excess    int64 // framing overhead not paid for by data (see ErrChunkOverhead)
}

// Reset prepares d for a new body, keeping the Trailers backing array.
func (d *ChunkedDecoder) Reset(lim Limits) {
	t := d.Trailers[:0]
	*d = ChunkedDecoder{Limits: lim, Trailers: t}
}

// Done reports whether the last chunk and the trailer section were decoded.
func (d *ChunkedDecoder) Done() bool { return d.state == stDone }

// Decode consumes chunked framing from src and returns the number of bytes
// consumed and the next run of body data, a sub-slice of src[:n]. Call it
// again with src[n:] (plus any newly read bytes) until Done.
//
//   - data non-empty, err nil: forward data, then continue.
//   - err == ErrNeedMore: src[n:] is an incomplete line; keep those bytes,
//     append more input and call again.
//   - err nil, data empty: the body is complete (Done is true); src[n:]
//     belongs to the next message.
//   - any other err is an *Error; the stream cannot continue.
func (d *ChunkedDecoder) Decode(src []byte) (n int, data []byte, err error) {
	for {
		switch d.state {
		case stDone:
			return n, nil, nil
		case stData:
			if n == len(src) {
				return n, nil, ErrNeedMore
			}
			k := int64(len(src) - n)
			if k > d.remaining {
				k = d.remaining
			}
			data = src[n : n+int(k)]
			n += int(k)
			d.remaining -= k
			if d.remaining == 0 {
				d.state = stDataCR
			}
			return n, data, nil
		case stDataCR, stDataLF:
			if n == len(src) {
				return n, nil, ErrNeedMore
			}
			want := byte('\r')
			if d.state == stDataLF {
				want = '\n'
			}
			if src[n] != want {
				return n, nil, ErrChunkMissingCRLF
			}
			n++
			if d.state == stDataCR {
				d.state = stDataLF
			} else {
				d.state = stSize
			}
		case stSize:
			rest := src[n:]
			w := len(rest)
			if w > MaxChunkLine+2 {
				w = MaxChunkLine + 2
			}
			lf := bytes.IndexByte(rest[:w], '\n')
			if lf < 0 {
				if len(rest) >= MaxChunkLine+2 || len(rest) == MaxChunkLine+1 && rest[MaxChunkLine] != '\r' {
					return n, nil, ErrChunkLineTooLong
				}
				return n, nil, ErrNeedMore
			}
			if lf == 0 || rest[lf-1] != '\r' {
				if lf > MaxChunkLine {
					return n, nil, ErrChunkLineTooLong
				}
				return n, nil, ErrChunkMissingCRLF
			}
			if lf-1 > MaxChunkLine {
				return n, nil, ErrChunkLineTooLong
			}
			size, err := parseChunkLine(rest[:lf-1])
			if err != nil {
				return n, nil, err
			}
			n += lf + 1
			// Overhead accounting as in net/http: 16 bytes of framing per
			// chunk plus twice its data are free; beyond that at most
			// MaxChunkOverhead bytes of non-data may accumulate.
			d.excess += int64(lf+1) - 16 // line + CRLF after the data, as net/http counts
			if size < 1<<61 {
				d.excess -= 2 * size
			} else {
				d.excess = 0
			}
			if d.excess < 0 {
				d.excess = 0
			}
			if d.excess > MaxChunkOverhead {
				return n, nil, ErrChunkOverhead
			}
			if size == 0 {
				d.state = stTrailer
			} else {
				d.remaining = size
				d.state = stData
			}
		case stTrailer:
			lim := d.Limits.norm()
			rest := src[n:]
			if len(rest) < lim.MaxHeaderBytes && !(len(rest) > 0 && rest[0] == '\n' ||
				len(rest) > 1 && rest[0] == '\r' && rest[1] == '\n' || headEnded(rest)) {
				return n, nil, ErrNeedMore // trailer section incomplete: validate once complete
			}
			d.Trailers = d.Trailers[:0]
			k, err := parseFields(src[n:], 0, lim, &d.Trailers, nil, false, 1)
			if err != nil {
				d.Trailers = d.Trailers[:0]
				return n, nil, err
			}
			n += k
			d.state = stDone
		}
	}
}

// parseChunkLine parses chunk-size [ chunk-ext ] (without CRLF).
func parseChunkLine(line []byte) (int64, error) {
	i := 0
	var size uint64
	for i < len(line) && class[line[i]]&cHex != 0 {
		if i == 16 {
			return 0, ErrBadChunkSize
		}
		size = size<<4 | uint64(unhex(line[i]))
		i++
	}
	if i == 0 {
		if len(line) == 0 {
			return 0, ErrBadChunkSize
		}
		return 0, classify(line[0], ErrBadChunkSize)
	}
	if size > 1<<63-1 {
		return 0, ErrChunkSizeOverflow
	}
	if i < len(line) && line[i] != ';' {
		return 0, classify(line[i], ErrBadChunkSize)
	}
	for i < len(line) {
		// line[i] == ';'
		i++
		s := i
		for i < len(line) && class[line[i]]&cToken != 0 {
			i++
		}
		if i == s {
			return 0, extErr(line, i)
		}
		if i < len(line) && line[i] == '=' {
			i++
			if i < len(line) && line[i] == '"' {
				i++
				closed := false
				for i < len(line) {
					b := line[i]
					if b == '"' {
						closed = true
						i++
						break
					}
					if b == '\\' {
						i++
						if i == len(line) || class[line[i]]&cValue == 0 {
							return 0, extErr(line, i)
						}
					} else if class[b]&cValue == 0 {
						return 0, extErr(line, i)
					}
					i++
				}
				if !closed {
					return 0, ErrBadChunkExt
				}
			} else {
				s := i
				for i < len(line) && class[line[i]]&cToken != 0 {
					i++
				}
				if i == s {
					return 0, extErr(line, i)
				}
			}
		}
		if i < len(line) && line[i] != ';' {
			return 0, extErr(line, i)
		}
	}
	return int64(size), nil
}

func extErr(line []byte, i int) error {
	if i < len(line) {
		return classify(line[i], ErrBadChunkExt)
	}
	return ErrBadChunkExt
}

func unhex(b byte) byte {
	switch {
	case b >= '0' && b <= '9':
		return b - '0'
	case b >= 'a' && b <= 'f':
		return b - 'a' + 10
	}
	return b - 'A' + 10
}

// AppendChunkHeader appends the size line of an n-byte chunk ("%x\r\n") to
// dst; n must be positive. Write "0\r\n\r\n" (LastChunk) to end a body
// without trailers.
func AppendChunkHeader(dst []byte, n int) []byte {
	var tmp [16]byte
	i := len(tmp)
	u := uint64(n)
	for {
		i--
		tmp[i] = "0123456789abcdef"[u&15]
		u >>= 4
		if u == 0 {
			break
		}
	}
	dst = append(dst, tmp[i:]...)
	return append(dst, '\r', '\n')
}

// LastChunk ends a chunked body that has no trailers.
const LastChunk = "0\r\n\r\n"
