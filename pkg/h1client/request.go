package h1client

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strconv"

	"golang.org/x/net/http/httpguts"

	"github.com/rl-tproxy/rl-tproxy/pkg/httpparse"
)

// appendHead appends req's HTTP/1.1 request head to b: the request line
// (origin form, or "*"), Host, req.Header's fields but the ones the
// client writes itself (Host, Content-Length, Transfer-Encoding,
// Trailer, Connection), the body's framing from req.ContentLength
// (chunked when the length is unknown, with a Trailer field naming
// req.Trailer's keys) and Connection: close when asked. keys is scratch
// space for the field names. Anything that
// cannot go on the wire as it is (a method that is not a token, a
// control byte in the target, an invalid Host, field name or value) is
// an error and nothing is sent.
func appendHead(b []byte, keys *[]string, req *http.Request, hasBody, chunked, close bool) ([]byte, error) {
	if !validMethod(req.Method) {
		return b, fmt.Errorf("invalid method %q", req.Method)
	}
	b = append(b, req.Method...)
	b = append(b, ' ')
	var err error
	if b, err = appendTarget(b, req.URL); err != nil {
		return b, err
	}
	b = append(b, " HTTP/1.1\r\nHost: "...)
	host := req.Host
	if host == "" && req.URL != nil {
		host = req.URL.Host
	}
	if !httpguts.ValidHostHeader(host) {
		return b, fmt.Errorf("invalid Host %q", host)
	}
	b = append(b, host...)
	b = append(b, '\r', '\n')
	// Fields in name order, as net/http writes them: the same request
	// gives the same bytes.
	ks := (*keys)[:0]
	for k := range req.Header {
		switch k {
		case "Host", "Content-Length", "Transfer-Encoding", "Trailer", "Connection":
			continue
		}
		ks = append(ks, k)
	}
	slices.Sort(ks)
	*keys = ks
	for _, k := range ks {
		vs := req.Header[k]
		if !httpguts.ValidHeaderFieldName(k) {
			return b, fmt.Errorf("invalid field name %q", k)
		}
		for _, v := range vs {
			if !httpguts.ValidHeaderFieldValue(v) {
				return b, fmt.Errorf("invalid value of field %s", k)
			}
			b = appendField(b, k, v)
		}
	}
	switch {
	case chunked:
		b = append(b, "Transfer-Encoding: chunked\r\n"...)
		if len(req.Trailer) > 0 {
			b = append(b, "Trailer: "...)
			first := true
			for k := range req.Trailer {
				if !httpguts.ValidHeaderFieldName(k) {
					return b, fmt.Errorf("invalid trailer name %q", k)
				}
				if !first {
					b = append(b, ", "...)
				}
				first = false
				b = append(b, k...)
			}
			b = append(b, '\r', '\n')
		}
	case hasBody:
		b = append(b, "Content-Length: "...)
		b = strconv.AppendInt(b, req.ContentLength, 10)
		b = append(b, '\r', '\n')
	case req.Method == http.MethodPost || req.Method == http.MethodPut || req.Method == http.MethodPatch:
		// A method that expects a body says it has none.
		b = append(b, "Content-Length: 0\r\n"...)
	}
	if close {
		b = append(b, "Connection: close\r\n"...)
	}
	return append(b, '\r', '\n'), nil
}

func appendField(b []byte, k, v string) []byte {
	b = append(b, k...)
	b = append(b, ':', ' ')
	b = append(b, v...)
	return append(b, '\r', '\n')
}

func validMethod(m string) bool {
	if m == "" {
		return false
	}
	for i := 0; i < len(m); i++ {
		if !httpparse.IsTchar(m[i]) {
			return false
		}
	}
	return true
}

// appendTarget appends u's request target: its opaque form ("*"), or its
// escaped path ("/" when empty) and query.
func appendTarget(b []byte, u *url.URL) ([]byte, error) {
	start := len(b)
	switch {
	case u == nil:
		b = append(b, '/')
	case u.Opaque != "":
		b = append(b, u.Opaque...)
	default:
		p := u.EscapedPath()
		if p == "" {
			p = "/"
		}
		b = append(b, p...)
		if u.RawQuery != "" || u.ForceQuery {
			b = append(b, '?')
			b = append(b, u.RawQuery...)
		}
	}
	for _, c := range b[start:] {
		if c <= ' ' || c == 0x7f {
			return b, fmt.Errorf("invalid request target %q", b[start:])
		}
	}
	return b, nil
}

var (
	errBodyShort = errors.New("request body shorter than its Content-Length")
	errBodyLong  = errors.New("request body longer than its Content-Length")
)

// sendBody writes the request head (in c.wbuf) and its body: a known
// length staged behind the head and written as the buffer fills, an
// unknown one (chunked) after the head went out alone, each read a chunk
// at once (a streaming client must not wait for a buffer to fill), then
// the last chunk and req.Trailer.
func (c *conn) sendBody(req *http.Request, head []byte, chunked bool) error {
	b := head
	defer func() { c.keepWriteBuf(b) }()
	if !chunked {
		left := req.ContentLength
		for left > 0 {
			if len(b) == cap(b) {
				if _, err := c.nc.Write(b); err != nil {
					return err
				}
				b = b[:0]
			}
			room := b[len(b):cap(b)]
			if int64(len(room)) > left {
				room = room[:left]
			}
			n, err := req.Body.Read(room)
			b = b[:len(b)+n]
			left -= int64(n)
			if err == io.EOF && left > 0 {
				return errBodyShort
			}
			if err != nil && err != io.EOF {
				return fmt.Errorf("read request body: %w", err)
			}
		}
		// The body must end where its length says, before its last
		// bytes go out: the upstream answers only a whole request.
		var one [1]byte
		for {
			n, err := req.Body.Read(one[:])
			if n > 0 {
				return errBodyLong
			}
			if err == io.EOF {
				break
			}
			if err != nil {
				return fmt.Errorf("read request body: %w", err)
			}
		}
		_, err := c.nc.Write(b)
		return err
	}
	if _, err := c.nc.Write(b); err != nil {
		return err
	}
	// A chunk's data is read at b[chunkHead:], its size line written
	// just before it.
	const chunkHead = 18 // 16 hex digits and CRLF
	if cap(b) < chunkHead+512 {
		b = make([]byte, 0, writeBufSize)
	}
	for {
		n, err := req.Body.Read(b[chunkHead : cap(b)-2])
		if n > 0 {
			size := strconv.AppendInt(b[:0:chunkHead], int64(n), 16)
			start := chunkHead - len(size) - 2
			copy(b[start:], size)
			b[chunkHead-2], b[chunkHead-1] = '\r', '\n'
			end := chunkHead + n
			b = b[:end+2]
			b[end], b[end+1] = '\r', '\n'
			if _, werr := c.nc.Write(b[start:]); werr != nil {
				return werr
			}
		}
		if err == io.EOF {
			break
		}
		if err != nil {
			return fmt.Errorf("read request body: %w", err)
		}
	}
	b = append(b[:0], "0\r\n"...)
	for k, vs := range req.Trailer {
		if !httpguts.ValidHeaderFieldName(k) {
			return fmt.Errorf("invalid trailer name %q", k)
		}
		for _, v := range vs {
			if !httpguts.ValidHeaderFieldValue(v) {
				return fmt.Errorf("invalid value of trailer %s", k)
			}
			b = appendField(b, k, v)
		}
	}
	b = append(b, '\r', '\n')
	_, err := c.nc.Write(b)
	return err
}
