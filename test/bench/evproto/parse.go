package main

import (
	"bytes"
	"strconv"

	"github.com/rl-tproxy/rl-tproxy/pkg/httpparse"
)

// parser finds where a request head and a response end. By default it
// only scans for the blank line and Content-Length (the floor); with
// -strict it runs pkg/httpparse on both heads, as the data path does, so
// the cost of strict parsing shows in the loop's numbers.
type parser struct {
	strict bool
	req    httpparse.Request
	resp   httpparse.Response
	lim    httpparse.Limits
}

var (
	crlf2     = []byte("\r\n\r\n")
	clKey     = []byte("\r\ncontent-length:")
	methodGET = []byte("GET")
)

// requestHead returns the length of the request head at the start of b
// (through CRLF CRLF), 0 when more bytes are needed, -1 when the prototype
// cannot relay it (malformed, too large, or with a body).
func (p *parser) requestHead(b []byte) int {
	if !p.strict {
		end := bytes.Index(b, crlf2)
		if end < 0 {
			return needMore(b)
		}
		return end + 4
	}
	err := p.req.Parse(b, p.lim)
	if err == httpparse.ErrNeedMore {
		return needMore(b)
	}
	if err != nil {
		return -1 // the data path answers the rule's status
	}
	if m := p.req.BodyMode(); m != httpparse.BodyNone && (m != httpparse.BodyLength || p.req.ContentLength != 0) {
		return -1
	}
	return p.req.HeadLen
}

// responseLen returns the length of the response at the start of b (head
// and Content-Length body), 0 when its head is incomplete, -1 when the
// prototype cannot relay it (other framing, malformed).
func (p *parser) responseLen(b []byte) int {
	if !p.strict {
		end := bytes.Index(b, crlf2)
		if end < 0 {
			return needMore(b)
		}
		head := b[:end+4]
		i := indexFold(head, clKey)
		if i < 0 {
			return -1
		}
		v := head[i+len(clKey):]
		v = v[:bytes.IndexByte(v, '\r')]
		n, err := strconv.Atoi(string(bytes.TrimSpace(v)))
		if err != nil || n < 0 {
			return -1
		}
		return len(head) + n
	}
	err := p.resp.Parse(b, p.lim, methodGET)
	if err == httpparse.ErrNeedMore {
		return needMore(b)
	}
	if err != nil || p.resp.Informational() || p.resp.BodyMode() != httpparse.BodyLength {
		return -1
	}
	return p.resp.HeadLen + int(p.resp.ContentLength)
}

func needMore(b []byte) int {
	if len(b) >= bufSize {
		return -1 // a head larger than a buffer
	}
	return 0
}

func indexFold(s, key []byte) int {
	for i := 0; i+len(key) <= len(s); i++ {
		if bytes.EqualFold(s[i:i+len(key)], key) {
			return i
		}
	}
	return -1
}
