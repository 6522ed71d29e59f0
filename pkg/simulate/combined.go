package simulate

import (
	"bytes"
	"strconv"

	"github.com/rl-tproxy/rl-tproxy/pkg/accesslog"
)

// ParseCombined reads one access line of `--log-format combined`
// (pkg/accesslog): the nginx combined columns, then key=value fields.
// Other lines (slog text: start, reload) are ErrNotAccess.
func ParseCombined(line []byte, r *Record) error {
	r.reset(len(line))
	if bytes.HasPrefix(line, []byte("time=")) {
		return ErrNotAccess
	}
	c := combinedScanner{b: line, r: r}
	remote, ok := c.token()
	if !ok {
		return ErrSyntax
	}
	if string(remote) != "-" {
		r.Remote = remote
	}
	if _, ok := c.token(); !ok { // ident
		return ErrSyntax
	}
	if _, ok := c.token(); !ok { // user
		return ErrSyntax
	}
	if !c.eat('[') {
		return ErrSyntax
	}
	end := bytes.IndexByte(line[c.i:], ']')
	if end < 0 {
		return ErrSyntax
	}
	if err := r.setTime(line[c.i:c.i+end], accesslog.TimeLayout); err != nil {
		return err
	}
	c.i += end + 1
	if !c.eat(' ') {
		return ErrSyntax
	}
	req, ok := c.quoted()
	if !ok || !c.eat(' ') {
		return ErrSyntax
	}
	r.setRequestLine(req)
	status, ok := c.token()
	if !ok {
		return ErrSyntax
	}
	n, err := strconv.Atoi(string(status))
	if err != nil || n < 0 || n > 999 {
		return ErrSyntax
	}
	r.Status = n
	if _, ok := c.token(); !ok { // bytes
		return ErrSyntax
	}
	ref, ok := c.quoted()
	if !ok || !c.eat(' ') {
		return ErrSyntax
	}
	agent, ok := c.quoted()
	if !ok {
		return ErrSyntax
	}
	if string(ref) != "-" {
		r.Referer = ref
	}
	if string(agent) != "-" {
		r.UserAgent = agent
	}
	for c.i < len(line) {
		if !c.eat(' ') {
			return ErrSyntax
		}
		eq := bytes.IndexByte(line[c.i:], '=')
		if eq <= 0 {
			return ErrSyntax
		}
		key := line[c.i : c.i+eq]
		c.i += eq + 1
		var v []byte
		if c.i < len(line) && line[c.i] == '"' {
			if v, ok = c.quoted(); !ok {
				return ErrSyntax
			}
		} else {
			start := c.i
			for c.i < len(line) && line[c.i] != ' ' {
				c.i++
			}
			v = line[start:c.i]
		}
		if string(key) == "duration_ms" || string(key) == accesslog.Status {
			r.setNumber(key, v)
			continue
		}
		r.setString(key, v)
	}
	return nil
}

// setRequestLine splits "METHOD TARGET PROTOCOL" ("-" when there was
// no request line) into method, path, query and proto.
func (r *Record) setRequestLine(req []byte) {
	if string(req) == "-" {
		return
	}
	sp := bytes.IndexByte(req, ' ')
	if sp < 0 {
		r.Method = req
		return
	}
	r.Method, req = req[:sp], req[sp+1:]
	if sp = bytes.LastIndexByte(req, ' '); sp >= 0 {
		r.Proto, req = req[sp+1:], req[:sp]
	}
	if q := bytes.IndexByte(req, '?'); q >= 0 {
		r.Path, r.Query = req[:q], req[q+1:]
	} else {
		r.Path = req
	}
}

type combinedScanner struct {
	b []byte
	i int
	r *Record
}

func (c *combinedScanner) eat(ch byte) bool {
	if c.i < len(c.b) && c.b[c.i] == ch {
		c.i++
		return true
	}
	return false
}

// token reads up to the next space and passes it.
func (c *combinedScanner) token() ([]byte, bool) {
	sp := bytes.IndexByte(c.b[c.i:], ' ')
	if sp <= 0 {
		return nil, false
	}
	t := c.b[c.i : c.i+sp]
	c.i += sp + 1
	return t, true
}

// quoted reads a "..." column, undoing nginx's \xHH escaping.
func (c *combinedScanner) quoted() ([]byte, bool) {
	if !c.eat('"') {
		return nil, false
	}
	start := c.i
	for c.i < len(c.b) {
		switch c.b[c.i] {
		case '"':
			v := c.b[start:c.i]
			c.i++
			return v, true
		case '\\':
			return c.quotedEscaped(start)
		}
		c.i++
	}
	return nil, false
}

func (c *combinedScanner) quotedEscaped(start int) ([]byte, bool) {
	r := c.r
	out := len(r.buf)
	r.buf = append(r.buf, c.b[start:c.i]...)
	for c.i < len(c.b) {
		ch := c.b[c.i]
		switch ch {
		case '"':
			c.i++
			return r.buf[out:len(r.buf):len(r.buf)], true
		case '\\':
			if c.i+3 >= len(c.b) || c.b[c.i+1] != 'x' {
				return nil, false
			}
			hi, ok1 := unhex(c.b[c.i+2])
			lo, ok2 := unhex(c.b[c.i+3])
			if !ok1 || !ok2 {
				return nil, false
			}
			r.buf = append(r.buf, hi<<4|lo)
			c.i += 4
		default:
			r.buf = append(r.buf, ch)
			c.i++
		}
	}
	return nil, false
}

func unhex(c byte) (byte, bool) {
	switch {
	case c >= '0' && c <= '9':
		return c - '0', true
	case c >= 'a' && c <= 'f':
		return c - 'a' + 10, true
	case c >= 'A' && c <= 'F':
		return c - 'A' + 10, true
	}
	return 0, false
}
