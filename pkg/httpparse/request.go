package httpparse

// Request is a parsed request head. All byte slices point into the buffer
// given to Parse and are valid as long as that buffer is.
type Request struct {
	Method, Target []byte
	Minor          int      // HTTP/1.<Minor>: 0 or 1
	Headers        []Header // backing array reused across Parse calls
	HeadLen        int      // bytes of the head including the final CRLF CRLF

	ContentLength int64 // -1 when absent (also when Chunked)
	Chunked       bool  // Transfer-Encoding: chunked
	Close         bool  // connection closes after this exchange (Connection: close, or HTTP/1.0 without keep-alive)
	Expect100     bool  // Expect: 100-continue (HTTP/1.1 only; ignored on HTTP/1.0 as RFC 9110 requires)
	Upgrade       bool  // Upgrade field present and Connection lists "upgrade"

	// Host is the authority of an absolute-form (or CONNECT authority-form)
	// target if there is one, else the Host field value (RFC 9112 3.2.2).
	Host []byte
	// HostHeader is the Host field value as sent (nil when absent).
	HostHeader []byte
}

// Reset clears r, keeping the Headers backing array.
func (r *Request) Reset() {
	hs := r.Headers[:0]
	*r = Request{Headers: hs, ContentLength: -1}
}

// Header returns the value of the first field named name (ASCII
// case-insensitive) without allocating.
func (r *Request) Header(name string) ([]byte, bool) { return lookup(r.Headers, name) }

// HeaderValue is Header under the name admission.HeaderGetter expects.
func (r *Request) HeaderValue(name string) ([]byte, bool) { return lookup(r.Headers, name) }

// HeaderHas reports whether any field named name lists token (comma-separated,
// case-insensitive), e.g. HeaderHas("connection", "close").
func (r *Request) HeaderHas(name, token string) bool { return listHas(r.Headers, name, token) }

// BodyMode is how the request body is delimited: BodyChunked, BodyLength
// (Content-Length present, possibly 0) or BodyNone.
func (r *Request) BodyMode() BodyMode {
	switch {
	case r.Chunked:
		return BodyChunked
	case r.ContentLength >= 0:
		return BodyLength
	}
	return BodyNone
}

// Parse parses the request head at the start of buf. It returns nil when a
// complete head was parsed (r.HeadLen bytes), ErrNeedMore when buf holds an
// incomplete head, or an *Error. Limits are enforced on incomplete input,
// so a caller growing its buffer never exceeds them. While the head is
// incomplete and within limits Parse only scans for its end (cheap to call
// after every read); rule violations are reported once the head is complete.
// Steady-state Parse does not allocate.
func (r *Request) Parse(buf []byte, lim Limits) error {
	lim = lim.norm()
	r.Reset()
	if err := needMore(buf, lim, ErrRequestLineTooLong); err != nil {
		return err
	}
	line, pos, err := startLine(buf, lim.MaxRequestLine)
	if err != nil {
		return err
	}
	if err := r.parseRequestLine(line); err != nil {
		return err
	}
	var f facts
	n, err := parseFields(buf, pos, lim, &r.Headers, &f, true, r.Minor)
	if err != nil {
		return err
	}
	if f.hasTE && f.hasCL {
		return ErrTEWithCL
	}
	if r.Minor == 1 && f.hostCount == 0 {
		return ErrMissingHost
	}
	r.HeadLen = n
	r.Chunked = f.chunked
	if f.hasCL {
		r.ContentLength = f.cl
	}
	if r.Minor == 0 {
		r.Close = f.close || !f.keepAlive
	} else {
		r.Close = f.close
	}
	r.Expect100 = f.expect100
	r.Upgrade = f.hasUpgrade && f.connUpg
	r.HostHeader = f.host
	if r.Host == nil {
		r.Host = f.host
		if r.Host == nil && f.hostCount > 0 {
			r.Host = buf[:0]
		}
	}
	if r.HostHeader == nil && f.hostCount > 0 {
		r.HostHeader = buf[:0]
	}
	return nil
}

func (r *Request) parseRequestLine(line []byte) error {
	i := 0
	for i < len(line) && class[line[i]]&cToken != 0 {
		i++
	}
	if i == len(line) {
		return ErrBadRequestLine
	}
	if line[i] != ' ' {
		return classify(line[i], ErrBadMethod)
	}
	if i == 0 {
		return ErrBadRequestLine
	}
	r.Method = line[:i]
	i++
	start := i
	for i < len(line) {
		b := line[i]
		if class[b]&cTarget == 0 {
			break
		}
		if b == '%' {
			if i+2 >= len(line) || class[line[i+1]]&cHex == 0 || class[line[i+2]]&cHex == 0 {
				return ErrBadTarget
			}
			i += 2
		}
		i++
	}
	if i == len(line) {
		return ErrBadRequestLine
	}
	if line[i] != ' ' {
		return classify(line[i], ErrBadTarget)
	}
	v := line[i+1:]
	for _, b := range v {
		if b == ' ' {
			return ErrBadRequestLine
		}
	}
	if i == start {
		return ErrBadTarget // "GET  HTTP/1.1": empty request-target
	}
	r.Target = line[start:i]
	minor, err := parseVersion(v)
	if err != nil {
		return err
	}
	r.Minor = minor
	return r.checkTarget()
}

// checkTarget enforces the request-target forms of RFC 9112 3.2.
func (r *Request) checkTarget() error {
	t := r.Target
	connect := string(r.Method) == "CONNECT"
	switch {
	case connect:
		if !validAuthority(t, true) {
			return ErrBadTarget
		}
		r.Host = t
		return nil
	case t[0] == '/':
		return nil
	case len(t) == 1 && t[0] == '*':
		if string(r.Method) != "OPTIONS" {
			return ErrBadTarget
		}
		return nil
	}
	// absolute-form: scheme "://" authority path-abempty [ "?" query ]
	k := 0
	for k < len(t) {
		b := t[k]
		if b >= 'a' && b <= 'z' || b >= 'A' && b <= 'Z' || k > 0 && (b >= '0' && b <= '9' || b == '+' || b == '-' || b == '.') {
			k++
			continue
		}
		break
	}
	if k == 0 || len(t) < k+3 || t[k] != ':' || t[k+1] != '/' || t[k+2] != '/' {
		return ErrBadTarget
	}
	if !EqualFold(t[:k], "http") && !EqualFold(t[:k], "https") {
		return ErrBadTarget
	}
	rest := t[k+3:]
	e := 0
	for e < len(rest) && rest[e] != '/' && rest[e] != '?' {
		e++
	}
	if !validAuthority(rest[:e], false) {
		return ErrBadTarget
	}
	r.Host = rest[:e]
	return nil
}
