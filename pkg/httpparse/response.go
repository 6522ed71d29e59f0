package httpparse

// Response is a parsed response head; slices point into the buffer given to
// Parse.
type Response struct {
	Minor   int // HTTP/1.<Minor>
	Status  int // 100..999
	Reason  []byte
	Headers []Header // backing array reused across Parse calls
	HeadLen int      // bytes of the head including the final CRLF CRLF

	ContentLength int64 // -1 when absent or not used for framing
	Chunked       bool  // body uses the chunked coding (only when BodyMode() == BodyChunked)
	Close         bool  // connection must close after this response (Connection: close, HTTP/1.0 without keep-alive, or close-delimited body)
	Upgrade       bool  // 101 with an Upgrade field
	mode          BodyMode
}

// Reset clears r, keeping the Headers backing array.
func (r *Response) Reset() {
	hs := r.Headers[:0]
	*r = Response{Headers: hs, ContentLength: -1}
}

// Header returns the value of the first field named name (ASCII
// case-insensitive) without allocating.
func (r *Response) Header(name string) ([]byte, bool) { return lookup(r.Headers, name) }

// HeaderHas reports whether any field named name lists token.
func (r *Response) HeaderHas(name, token string) bool { return listHas(r.Headers, name, token) }

// BodyMode is how the body of this response is delimited (RFC 9112 6.3):
// none for a HEAD request, 1xx, 204, 304 and a 2xx answer to CONNECT;
// otherwise chunked, Content-Length, or close-delimited.
func (r *Response) BodyMode() BodyMode { return r.mode }

// Informational reports a 1xx interim response: another head follows.
func (r *Response) Informational() bool { return r.Status >= 100 && r.Status < 200 }

// Parse parses the response head at the start of buf; reqMethod is the method
// of the request it answers (it decides whether a body exists). Results as
// for Request.Parse. The status line is bounded by lim.MaxRequestLine.
func (r *Response) Parse(buf []byte, lim Limits, reqMethod []byte) error {
	lim = lim.norm()
	r.Reset()
	if err := needMore(buf, lim, ErrStatusLineTooLong); err != nil {
		return err
	}
	line, pos, err := startLine(buf, lim.MaxRequestLine)
	if err == ErrRequestLineTooLong {
		return ErrStatusLineTooLong
	}
	if err != nil {
		return err
	}
	if err := r.parseStatusLine(line); err != nil {
		return err
	}
	var f facts
	n, err := parseFields(buf, pos, lim, &r.Headers, &f, false, r.Minor)
	if err != nil {
		return err
	}
	if f.hasTE && f.hasCL {
		return ErrTEWithCL
	}
	r.HeadLen = n
	r.Close = f.close || r.Minor == 0 && !f.keepAlive
	r.Upgrade = r.Status == 101 && f.hasUpgrade
	m := string(reqMethod)
	switch {
	case m == "HEAD", r.Status < 200, r.Status == 204, r.Status == 304,
		m == "CONNECT" && r.Status < 300:
		r.mode = BodyNone
	case f.chunked:
		r.mode, r.Chunked = BodyChunked, true
	case f.hasCL:
		r.mode, r.ContentLength = BodyLength, f.cl
	default:
		r.mode, r.Close = BodyClose, true
	}
	return nil
}

func (r *Response) parseStatusLine(line []byte) error {
	sp := -1
	for i, b := range line {
		if b == ' ' {
			sp = i
			break
		}
	}
	if sp < 0 {
		for _, b := range line {
			if e := classify(b, nil); e != nil {
				return e
			}
		}
		return ErrBadStatusLine
	}
	minor, err := parseVersion(line[:sp])
	if err != nil {
		return err
	}
	r.Minor = minor
	c := line[sp+1:]
	if len(c) < 3 || len(c) > 3 && c[3] != ' ' {
		for _, b := range c {
			if e := classify(b, nil); e != nil {
				return e
			}
		}
		return ErrBadStatusCode
	}
	st := 0
	for _, b := range c[:3] {
		if b < '0' || b > '9' {
			return classify(b, ErrBadStatusCode)
		}
		st = st*10 + int(b-'0')
	}
	if st < 100 {
		return ErrBadStatusCode
	}
	r.Status = st
	if len(c) > 3 {
		reason := c[4:]
		for _, b := range reason {
			if class[b]&cValue == 0 {
				return classify(b, ErrBadStatusLine)
			}
		}
		r.Reason = reason
	}
	return nil
}
