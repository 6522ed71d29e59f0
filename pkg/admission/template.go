package admission

import (
	"bytes"
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// Template is a compiled `{var}` template: literal text plus request
// variables, rendered per request into a caller-supplied buffer.
//
// Syntax: `{name}` inserts a variable; `{{` is a literal `{` and `}}` a
// literal `}`. A lone `}`, an unterminated `{`, an empty `{}` and an unknown
// variable are compile errors. Variables: remote_addr, remote_port,
// peer_addr, host, method, path, server_addr, server_port, query.NAME,
// header.NAME, cookie.NAME, sni, alpn. remote_addr is the client (the
// service's client_address, else the TCP peer), peer_addr the TCP peer
// always; remote_port is 0 for a client named by a forwarding header.
// A missing query parameter, header or cookie
// renders as empty; sni (lower-cased) and alpn (the client's first
// protocol) are set only for TLS passthrough connections.
type Template struct {
	src       string
	parts     []tmplPart
	staticLen int // literal bytes
	// Limits checked by Render after rendering (set by the policy compiler).
	max      int  // 0 = no limit
	nonEmpty bool // an empty result is an error
}

type varKind uint8

const (
	varLiteral varKind = iota
	varRemoteAddr
	varRemotePort
	varPeerAddr
	varHost
	varMethod
	varPath
	varServerAddr
	varServerPort
	varQuery
	varHeader
	varCookie
	varSNI
	varALPN
)

type tmplPart struct {
	kind varKind
	text string // literal text, or the NAME of query./header./cookie.
}

var simpleVars = map[string]varKind{
	"remote_addr": varRemoteAddr,
	"remote_port": varRemotePort,
	"peer_addr":   varPeerAddr,
	"host":        varHost,
	"method":      varMethod,
	"path":        varPath,
	"server_addr": varServerAddr,
	"server_port": varServerPort,
	"sni":         varSNI,
	"alpn":        varALPN,
}

var prefixVars = []struct {
	prefix string
	kind   varKind
}{
	{"query.", varQuery},
	{"header.", varHeader},
	{"cookie.", varCookie},
}

// TemplateVariables lists the variable names a template may use (for docs
// and error messages).
const TemplateVariables = "remote_addr, remote_port, peer_addr, host, method, path, server_addr, server_port, query.NAME, header.NAME, cookie.NAME, sni, alpn"

// Errors returned by Render. They are preallocated: rendering never allocates.
var (
	ErrTemplateTooLong = errors.New("rendered value too long")
	ErrTemplateEmpty   = errors.New("rendered value empty")
)

// CompileTemplate parses src. Errors describe the offending variable or
// brace and its byte offset.
func CompileTemplate(src string) (*Template, error) {
	t := &Template{src: src}
	var lit strings.Builder
	flush := func() {
		if lit.Len() > 0 {
			t.parts = append(t.parts, tmplPart{kind: varLiteral, text: lit.String()})
			t.staticLen += lit.Len()
			lit.Reset()
		}
	}
	for i := 0; i < len(src); {
		c := src[i]
		switch {
		case c == '{' && i+1 < len(src) && src[i+1] == '{':
			lit.WriteByte('{')
			i += 2
		case c == '}' && i+1 < len(src) && src[i+1] == '}':
			lit.WriteByte('}')
			i += 2
		case c == '}':
			return nil, fmt.Errorf("unmatched '}' at offset %d (write '}}' for a literal brace)", i)
		case c == '{':
			end := strings.IndexByte(src[i+1:], '}')
			if end < 0 {
				return nil, fmt.Errorf("unterminated '{' at offset %d (write '{{' for a literal brace)", i)
			}
			name := src[i+1 : i+1+end]
			p, err := compileVar(name)
			if err != nil {
				return nil, fmt.Errorf("offset %d: %w", i, err)
			}
			flush()
			t.parts = append(t.parts, p)
			i += end + 2
		default:
			lit.WriteByte(c)
			i++
		}
	}
	flush()
	return t, nil
}

func compileVar(name string) (tmplPart, error) {
	if name == "" {
		return tmplPart{}, errors.New("empty variable {}")
	}
	if k, ok := simpleVars[name]; ok {
		return tmplPart{kind: k}, nil
	}
	for _, pv := range prefixVars {
		if arg, ok := strings.CutPrefix(name, pv.prefix); ok {
			if arg == "" {
				return tmplPart{}, fmt.Errorf("variable {%s} needs a name after %q", name, pv.prefix)
			}
			valid := isToken
			if pv.kind == varQuery {
				valid = isQueryName
			}
			if !valid(arg) {
				return tmplPart{}, fmt.Errorf("variable {%s}: invalid name %q", name, arg)
			}
			if pv.kind == varHeader {
				arg = strings.ToLower(arg)
			}
			return tmplPart{kind: pv.kind, text: arg}, nil
		}
	}
	return tmplPart{}, fmt.Errorf("unknown variable {%s} (known: %s)", name, TemplateVariables)
}

// isToken reports whether s is an RFC 9110 token (header and cookie names).
func isToken(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		if !tokenChar[s[i]] {
			return false
		}
	}
	return true
}

// isQueryName accepts printable ASCII except the query delimiters and braces.
func isQueryName(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c <= ' ' || c >= 0x7f || c == '&' || c == '=' || c == '#' || c == '{' || c == '}' {
			return false
		}
	}
	return s != ""
}

var tokenChar = func() (t [256]bool) {
	for c := '0'; c <= '9'; c++ {
		t[c] = true
	}
	for c := 'a'; c <= 'z'; c++ {
		t[c] = true
		t[c-32] = true
	}
	for _, c := range "!#$%&'*+-.^_`|~" {
		t[c] = true
	}
	return
}()

// String returns the template's source text.
func (t *Template) String() string { return t.src }

// Static reports whether the template has no variables.
func (t *Template) Static() bool {
	for _, p := range t.parts {
		if p.kind != varLiteral {
			return false
		}
	}
	return true
}

// ClientValue returns the first variable whose value the client chooses
// freely ({query.NAME}, {header.NAME}, {cookie.NAME}), or "" when there is
// none: such a value may be missing or oversized at will.
func (t *Template) ClientValue() string {
	if t == nil {
		return ""
	}
	for _, p := range t.parts {
		switch p.kind {
		case varQuery:
			return "{query." + p.text + "}"
		case varHeader:
			return "{header." + p.text + "}"
		case varCookie:
			return "{cookie." + p.text + "}"
		}
	}
	return ""
}

// ForwardingHeader returns the first forwarding header the template
// renders ({header.x-forwarded-for}, {header.forwarded} or
// {header.x-real-ip}), or "": any client can write one, so a key on it is
// the client's choice unless a trusted balancer rewrites it.
func (t *Template) ForwardingHeader() string {
	if t == nil {
		return ""
	}
	for _, p := range t.parts {
		if p.kind != varHeader {
			continue
		}
		switch strings.ToLower(p.text) {
		case "x-forwarded-for", "forwarded", "x-real-ip":
			return "{header." + p.text + "}"
		}
	}
	return ""
}

// StaticLen is the number of literal bytes: a lower bound on every rendering.
// A nil template has length 0.
func (t *Template) StaticLen() int {
	if t == nil {
		return 0
	}
	return t.staticLen
}

// Max is the largest rendered length Render accepts (0 = unlimited).
func (t *Template) Max() int { return t.max }

// literalPrefix is the literal text every rendering of t starts with.
func (t *Template) literalPrefix() string {
	var b strings.Builder
	for _, p := range t.parts {
		if p.kind != varLiteral {
			break
		}
		b.WriteString(p.text)
	}
	return b.String()
}

// Render appends the template rendered for r to dst. It does not allocate
// when dst has room. When the result is longer than the template's limit,
// or empty where a value is required, it returns dst unchanged and
// ErrTemplateTooLong or ErrTemplateEmpty.
func (t *Template) Render(dst []byte, r *Request) ([]byte, error) {
	start := len(dst)
	for i := range t.parts {
		p := &t.parts[i]
		switch p.kind {
		case varLiteral:
			dst = append(dst, p.text...)
		case varRemoteAddr:
			if r.Remote.IsValid() {
				dst = r.Remote.Addr().Unmap().AppendTo(dst)
			}
		case varRemotePort:
			if r.Remote.IsValid() {
				dst = strconv.AppendUint(dst, uint64(r.Remote.Port()), 10)
			}
		case varPeerAddr:
			peer := r.Peer
			if !peer.IsValid() {
				peer = r.Remote // no client_address: the peer is the client
			}
			if peer.IsValid() {
				dst = peer.Addr().Unmap().AppendTo(dst)
			}
		case varServerAddr:
			if r.Local.IsValid() {
				dst = r.Local.Addr().Unmap().AppendTo(dst)
			}
		case varServerPort:
			if r.Local.IsValid() {
				dst = strconv.AppendUint(dst, uint64(r.Local.Port()), 10)
			}
		case varHost:
			dst = appendLower(dst, hostOnly(r.Host))
		case varMethod:
			dst = append(dst, r.Method...)
		case varSNI:
			dst = appendLower(dst, r.SNI)
		case varALPN:
			dst = append(dst, r.ALPN...)
		case varPath:
			dst = append(dst, r.Path...)
		case varQuery:
			if v, ok := queryParam(r.Query, p.text); ok {
				dst = append(dst, v...)
			}
		case varHeader:
			if r.Headers != nil {
				if v, ok := r.Headers.HeaderValue(p.text); ok {
					dst = append(dst, v...)
				}
			}
		case varCookie:
			if r.Headers != nil {
				if h, ok := r.Headers.HeaderValue("cookie"); ok {
					if v, ok := cookieValue(h, p.text); ok {
						dst = append(dst, v...)
					}
				}
			}
		}
	}
	n := len(dst) - start
	if t.max > 0 && n > t.max {
		return dst[:start], ErrTemplateTooLong
	}
	if t.nonEmpty && n == 0 {
		return dst[:start], ErrTemplateEmpty
	}
	return dst, nil
}

// hostOnly strips an optional port from a Host value (also for [v6]:port).
func hostOnly(h []byte) []byte {
	if len(h) > 0 && h[0] == '[' {
		for i := 1; i < len(h); i++ {
			if h[i] == ']' {
				return h[:i+1]
			}
		}
		return h
	}
	for i := len(h) - 1; i >= 0; i-- {
		switch c := h[i]; {
		case c == ':':
			return h[:i]
		case c < '0' || c > '9':
			return h
		}
	}
	return h
}

func appendLower(dst, s []byte) []byte {
	for _, c := range s {
		if 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		dst = append(dst, c)
	}
	return dst
}

// queryParam returns the raw (not percent-decoded) value of the first
// parameter named name in a query string.
func queryParam(q []byte, name string) ([]byte, bool) {
	for len(q) > 0 {
		var kv []byte
		if i := bytes.IndexByte(q, '&'); i >= 0 {
			kv, q = q[:i], q[i+1:]
		} else {
			kv, q = q, nil
		}
		k, v := kv, []byte(nil)
		if i := bytes.IndexByte(kv, '='); i >= 0 {
			k, v = kv[:i], kv[i+1:]
		}
		if string(k) == name {
			return v, true
		}
	}
	return nil, false
}

// cookieValue finds name in a Cookie header value ("a=1; b=2"), dropping
// optional surrounding double quotes.
func cookieValue(h []byte, name string) ([]byte, bool) {
	for len(h) > 0 {
		var pair []byte
		if i := bytes.IndexByte(h, ';'); i >= 0 {
			pair, h = h[:i], h[i+1:]
		} else {
			pair, h = h, nil
		}
		pair = trimOWS(pair)
		i := bytes.IndexByte(pair, '=')
		if i < 0 {
			continue
		}
		if string(trimOWS(pair[:i])) != name {
			continue
		}
		v := trimOWS(pair[i+1:])
		if len(v) >= 2 && v[0] == '"' && v[len(v)-1] == '"' {
			v = v[1 : len(v)-1]
		}
		return v, true
	}
	return nil, false
}

func trimOWS(b []byte) []byte {
	for len(b) > 0 && (b[0] == ' ' || b[0] == '\t') {
		b = b[1:]
	}
	for len(b) > 0 && (b[len(b)-1] == ' ' || b[len(b)-1] == '\t') {
		b = b[:len(b)-1]
	}
	return b
}
