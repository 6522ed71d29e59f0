package simulate

import (
	"bytes"
	"errors"
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/rl-tproxy/rl-tproxy/pkg/accesslog"
)

// Record is what simulate reads of one access line. The byte slices
// alias the line or the Record's own scratch space and are valid until
// the next parse into the same Record.
type Record struct {
	Time                 time.Time
	Service, Location    []byte
	Remote               []byte // "ip:port" (JSON) or "ip" (combined)
	Method, Host, Path   []byte
	Query                []byte
	Proto                []byte
	Status               int
	Verdict, Outcome     []byte
	Cause, DenyZones     []byte
	DurationMs           float64
	HasDuration          bool
	UserAgent, Referer   []byte
	Traceparent, ReqID   []byte
	SNI, ALPN            []byte
	buf                  []byte
	timeRaw, lastTimeRaw []byte
	lastTime             time.Time
}

// Errors of the line parsers.
var (
	ErrNotAccess = errors.New("not an access line")
	ErrSyntax    = errors.New("malformed line")
	ErrTime      = errors.New("missing or malformed time")
)

func (r *Record) reset(n int) {
	buf, last, lastT := r.buf, r.lastTimeRaw, r.lastTime
	*r = Record{}
	// Unescaped values are never longer than their escaped form, so a
	// scratch buffer as long as the line never moves under the slices.
	if cap(buf) < n {
		buf = make([]byte, 0, n)
	}
	r.buf, r.lastTimeRaw, r.lastTime = buf[:0], last, lastT
}

// setTime parses the line's time, reusing the previous line's result
// when the text is the same (combined times repeat for a second).
func (r *Record) setTime(raw []byte, layout string) error {
	if len(raw) > 0 && bytes.Equal(raw, r.lastTimeRaw) {
		r.Time = r.lastTime
		return nil
	}
	t, err := time.Parse(layout, string(raw))
	if err != nil {
		return ErrTime
	}
	r.Time, r.lastTime = t, t
	r.lastTimeRaw = append(r.lastTimeRaw[:0], raw...)
	return nil
}

// ParseJSON reads one line of `--log-format json`: a flat JSON object.
// A line whose msg is not "access" is ErrNotAccess.
func ParseJSON(line []byte, r *Record) error {
	r.reset(len(line))
	p := jsonScanner{b: line}
	p.ws()
	if !p.eat('{') {
		return ErrSyntax
	}
	access := false
	for first := true; ; first = false {
		p.ws()
		if p.eat('}') {
			break
		}
		if !first && !p.eat(',') {
			return ErrSyntax
		}
		p.ws()
		key, ok := p.str(r)
		if !ok {
			return ErrSyntax
		}
		p.ws()
		if !p.eat(':') {
			return ErrSyntax
		}
		p.ws()
		if p.i < len(p.b) && p.b[p.i] == '"' {
			v, ok := p.str(r)
			if !ok {
				return ErrSyntax
			}
			if string(key) == "msg" {
				access = string(v) == accesslog.Message
				continue
			}
			if string(key) == "time" {
				r.timeRaw = v
				continue
			}
			r.setString(key, v)
			continue
		}
		start := p.i
		if !p.skipValue(0) {
			return ErrSyntax
		}
		r.setNumber(key, line[start:p.i])
	}
	p.ws()
	if p.i != len(p.b) {
		return ErrSyntax
	}
	if !access {
		return ErrNotAccess
	}
	return r.setTime(r.timeRaw, time.RFC3339Nano)
}

func (r *Record) setString(key, v []byte) {
	switch string(key) {
	case "service":
		r.Service = v
	case "location":
		r.Location = v
	case accesslog.Remote:
		r.Remote = v
	case accesslog.Method:
		r.Method = v
	case "host":
		r.Host = v
	case accesslog.Path:
		r.Path = v
	case accesslog.Query:
		r.Query = v
	case accesslog.Proto:
		r.Proto = v
	case "verdict":
		r.Verdict = v
	case "outcome":
		r.Outcome = v
	case "cause":
		r.Cause = v
	case "deny_zones":
		r.DenyZones = v
	case accesslog.UserAgent:
		r.UserAgent = v
	case accesslog.Referer:
		r.Referer = v
	case "traceparent":
		r.Traceparent = v
	case "request_id":
		r.ReqID = v
	case "sni":
		r.SNI = v
	case "alpn":
		r.ALPN = v
	}
}

func (r *Record) setNumber(key, v []byte) {
	switch string(key) {
	case accesslog.Status:
		if n, err := strconv.Atoi(string(v)); err == nil && n >= 0 && n <= 999 {
			r.Status = n
		}
	case "duration_ms":
		if f, err := strconv.ParseFloat(string(v), 64); err == nil && f >= 0 && f < 1e12 {
			r.DurationMs, r.HasDuration = f, true
		}
	}
}

type jsonScanner struct {
	b []byte
	i int
}

func (p *jsonScanner) ws() {
	for p.i < len(p.b) {
		switch p.b[p.i] {
		case ' ', '\t', '\r', '\n':
			p.i++
		default:
			return
		}
	}
}

func (p *jsonScanner) eat(c byte) bool {
	if p.i < len(p.b) && p.b[p.i] == c {
		p.i++
		return true
	}
	return false
}

// str reads a JSON string: a slice of the line when it has no escapes,
// else its unescaped bytes in r's scratch buffer.
func (p *jsonScanner) str(r *Record) ([]byte, bool) {
	if !p.eat('"') {
		return nil, false
	}
	start := p.i
	for p.i < len(p.b) {
		c := p.b[p.i]
		switch {
		case c == '"':
			s := p.b[start:p.i]
			p.i++
			return s, true
		case c == '\\':
			return p.strEscaped(r, start)
		case c < 0x20:
			return nil, false
		}
		p.i++
	}
	return nil, false
}

func (p *jsonScanner) strEscaped(r *Record, start int) ([]byte, bool) {
	out := len(r.buf)
	r.buf = append(r.buf, p.b[start:p.i]...)
	for p.i < len(p.b) {
		c := p.b[p.i]
		switch {
		case c == '"':
			p.i++
			return r.buf[out:len(r.buf):len(r.buf)], true
		case c < 0x20:
			return nil, false
		case c != '\\':
			r.buf = append(r.buf, c)
			p.i++
			continue
		}
		if p.i+1 >= len(p.b) {
			return nil, false
		}
		e := p.b[p.i+1]
		p.i += 2
		switch e {
		case '"', '\\', '/':
			r.buf = append(r.buf, e)
		case 'b':
			r.buf = append(r.buf, '\b')
		case 'f':
			r.buf = append(r.buf, '\f')
		case 'n':
			r.buf = append(r.buf, '\n')
		case 'r':
			r.buf = append(r.buf, '\r')
		case 't':
			r.buf = append(r.buf, '\t')
		case 'u':
			cp, ok := p.hex4()
			if !ok {
				return nil, false
			}
			if cp >= 0xd800 && cp < 0xdc00 && p.i+1 < len(p.b) && p.b[p.i] == '\\' && p.b[p.i+1] == 'u' {
				p.i += 2
				lo, ok := p.hex4()
				if !ok {
					return nil, false
				}
				if lo >= 0xdc00 && lo < 0xe000 {
					cp = 0x10000 + (cp-0xd800)<<10 + (lo - 0xdc00)
				} else {
					r.buf = utf8.AppendRune(r.buf, utf8.RuneError)
					cp = lo
				}
			}
			r.buf = utf8.AppendRune(r.buf, rune(cp))
		default:
			return nil, false
		}
	}
	return nil, false
}

func (p *jsonScanner) hex4() (uint32, bool) {
	if p.i+4 > len(p.b) {
		return 0, false
	}
	var v uint32
	for _, c := range p.b[p.i : p.i+4] {
		v <<= 4
		switch {
		case c >= '0' && c <= '9':
			v |= uint32(c - '0')
		case c >= 'a' && c <= 'f':
			v |= uint32(c - 'a' + 10)
		case c >= 'A' && c <= 'F':
			v |= uint32(c - 'A' + 10)
		default:
			return 0, false
		}
	}
	p.i += 4
	return v, true
}

// maxDepth bounds the nesting of values skipped (groups, arrays).
const maxDepth = 16

// skipValue passes over a number, literal, object or array.
func (p *jsonScanner) skipValue(depth int) bool {
	if depth > maxDepth || p.i >= len(p.b) {
		return false
	}
	switch c := p.b[p.i]; {
	case c == '"':
		return p.skipString()
	case c == '{' || c == '[':
		end := byte('}')
		if c == '[' {
			end = ']'
		}
		p.i++
		for first := true; ; first = false {
			p.ws()
			if p.eat(end) {
				return true
			}
			if !first && !p.eat(',') {
				return false
			}
			p.ws()
			if end == '}' {
				if !p.skipString() {
					return false
				}
				p.ws()
				if !p.eat(':') {
					return false
				}
				p.ws()
			}
			if !p.skipValue(depth + 1) {
				return false
			}
		}
	default:
		start := p.i
		for p.i < len(p.b) {
			c := p.b[p.i]
			if c == ',' || c == '}' || c == ']' || c == ' ' || c == '\t' || c == '\r' || c == '\n' {
				break
			}
			p.i++
		}
		return p.i > start
	}
}

// skipString passes over a string without keeping it.
func (p *jsonScanner) skipString() bool {
	if !p.eat('"') {
		return false
	}
	for p.i < len(p.b) {
		switch c := p.b[p.i]; {
		case c == '"':
			p.i++
			return true
		case c == '\\':
			p.i += 2
			continue
		case c < 0x20:
			return false
		}
		p.i++
	}
	return false
}
