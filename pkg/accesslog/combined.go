// Package accesslog lays access lines out in the nginx "combined" format,
// with the proxy's own fields appended, so that log pipelines built for
// nginx (GoAccess, Loki/Promtail rules) read them unchanged. It is a
// slog.Handler: the access line's fields come in as attributes.
package accesslog

import (
	"context"
	"io"
	"log/slog"
	"net/netip"
	"strconv"
	"strings"
	"sync"
)

// Message is the slog message of an access line; other records are
// written as slog text.
const Message = "access"

// Access line attributes the combined layout places in its own columns.
// Every other attribute is appended as key=value.
const (
	Remote    = "remote"     // "ip:port"; the column shows the ip
	Method    = "method"     // request method
	Path      = "path"       // target path (without the query)
	Query     = "query"      // query string without '?'
	Proto     = "proto"      // "http/1.1", "http/1.0", "h2", ...
	Status    = "status"     // status sent to the client
	BytesOut  = "bytes_out"  // response bytes written
	Referer   = "referer"    // Referer field
	UserAgent = "user_agent" // User-Agent field
)

// TimeLayout is nginx's $time_local.
const TimeLayout = "02/Jan/2006:15:04:05 -0700"

// Combined is the handler. Create it with NewCombined.
type Combined struct {
	mu    *sync.Mutex
	w     io.Writer
	level slog.Leveler
	text  slog.Handler // non-access records
	attrs []slog.Attr  // from WithAttrs, keys already prefixed
	group string       // WithGroup prefix ("a.b.")
}

// NewCombined returns a handler writing access lines in the combined
// layout and every other record with slog's text handler, both to w, one
// line per Write.
func NewCombined(w io.Writer, opts *slog.HandlerOptions) *Combined {
	if opts == nil {
		opts = &slog.HandlerOptions{}
	}
	lv := opts.Level
	if lv == nil {
		lv = slog.LevelInfo
	}
	mu := &sync.Mutex{}
	lw := &lockedWriter{mu: mu, w: w}
	return &Combined{mu: mu, w: w, level: lv, text: slog.NewTextHandler(lw, opts)}
}

type lockedWriter struct {
	mu *sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// Enabled implements slog.Handler.
func (h *Combined) Enabled(_ context.Context, l slog.Level) bool { return l >= h.level.Level() }

// WithAttrs implements slog.Handler.
func (h *Combined) WithAttrs(as []slog.Attr) slog.Handler {
	c := *h
	c.attrs = append([]slog.Attr(nil), h.attrs...)
	for _, a := range as {
		a.Key = h.group + a.Key
		c.attrs = append(c.attrs, a)
	}
	c.text = h.text.WithAttrs(as)
	return &c
}

// WithGroup implements slog.Handler.
func (h *Combined) WithGroup(name string) slog.Handler {
	if name == "" {
		return h
	}
	c := *h
	c.group = h.group + name + "."
	c.text = h.text.WithGroup(name)
	return &c
}

// line collects the columns of one access line.
type line struct {
	remote, method, path, query, proto, referer, agent string
	status, bytes                                      string
	extra                                              []byte
}

// Handle implements slog.Handler.
func (h *Combined) Handle(ctx context.Context, r slog.Record) error {
	if r.Message != Message {
		return h.text.Handle(ctx, r)
	}
	var l line
	for _, a := range h.attrs {
		l.add("", a)
	}
	r.Attrs(func(a slog.Attr) bool {
		l.add(h.group, a)
		return true
	})
	b := make([]byte, 0, 256+len(l.extra))
	b = append(b, orDash(l.remote)...)
	b = append(b, " - - ["...)
	b = r.Time.AppendFormat(b, TimeLayout)
	b = append(b, "] \""...)
	b = appendEscaped(b, l.requestLine())
	b = append(b, "\" "...)
	b = append(b, statusColumn(l.status)...)
	b = append(b, ' ')
	b = append(b, orDash(l.bytes)...)
	b = append(b, " \""...)
	b = appendEscaped(b, orDash(l.referer))
	b = append(b, "\" \""...)
	b = appendEscaped(b, orDash(l.agent))
	b = append(b, '"')
	b = append(b, l.extra...)
	b = append(b, '\n')
	h.mu.Lock()
	defer h.mu.Unlock()
	_, err := h.w.Write(b)
	return err
}

func (l *line) add(prefix string, a slog.Attr) {
	a.Value = a.Value.Resolve()
	if a.Equal(slog.Attr{}) {
		return
	}
	if a.Value.Kind() == slog.KindGroup {
		p := prefix
		if a.Key != "" {
			p += a.Key + "."
		}
		for _, g := range a.Value.Group() {
			l.add(p, g)
		}
		return
	}
	key := prefix + a.Key
	if prefix == "" {
		v := a.Value.String()
		switch key {
		case Remote:
			l.remote = hostOf(v)
			return
		case Method:
			l.method = v
			return
		case Path:
			l.path = v
			return
		case Query:
			l.query = v
			return
		case Proto:
			l.proto = v
			return
		case Status:
			l.status = v
			return
		case BytesOut:
			l.bytes = v
			return
		case Referer:
			l.referer = v
			return
		case UserAgent:
			l.agent = v
			return
		}
	}
	l.extra = append(l.extra, ' ')
	l.extra = appendKey(l.extra, key)
	l.extra = append(l.extra, '=')
	l.extra = appendValue(l.extra, a.Value)
}

// requestLine is nginx's $request: "METHOD TARGET PROTOCOL".
func (l *line) requestLine() string {
	if l.method == "" && l.path == "" {
		return "-"
	}
	t := l.path
	if l.query != "" {
		t += "?" + l.query
	}
	return l.method + " " + t + " " + protoVersion(l.proto)
}

// protoVersion maps the proto field to the request line's version.
func protoVersion(p string) string {
	switch p {
	case "http/1.1":
		return "HTTP/1.1"
	case "http/1.0":
		return "HTTP/1.0"
	case "h2":
		return "HTTP/2.0"
	case "":
		return "-"
	}
	return strings.ToUpper(p)
}

// hostOf drops the port of "ip:port" ("[v6]:port" too).
func hostOf(s string) string {
	if ap, err := netip.ParseAddrPort(s); err == nil {
		return ap.Addr().Unmap().String()
	}
	return s
}

// statusColumn is the status, or 499 (nginx's "client closed request")
// when nothing was sent: log parsers expect a three-digit status.
func statusColumn(s string) string {
	if len(s) != 3 {
		return "499"
	}
	return s
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// appendEscaped escapes as nginx's escape=default does: '"', '\' and bytes
// outside printable ASCII become \xHH.
func appendEscaped(b []byte, s string) []byte {
	const hex = "0123456789ABCDEF"
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c == '"' || c == '\\' || c < 0x20 || c >= 0x7f {
			b = append(b, '\\', 'x', hex[c>>4], hex[c&0xf])
			continue
		}
		b = append(b, c)
	}
	return b
}

// appendKey writes a key with anything but [A-Za-z0-9_.-] replaced by '_',
// so that a key=value pair always splits at its first '='.
func appendKey(b []byte, k string) []byte {
	if k == "" {
		return append(b, '_')
	}
	for i := 0; i < len(k); i++ {
		c := k[i]
		if c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '.' || c == '-' {
			b = append(b, c)
		} else {
			b = append(b, '_')
		}
	}
	return b
}

// appendValue writes a value bare when it is non-empty printable ASCII
// without space, '"', '\' or '=', else quoted and escaped.
func appendValue(b []byte, v slog.Value) []byte {
	switch v.Kind() {
	case slog.KindInt64:
		return strconv.AppendInt(b, v.Int64(), 10)
	case slog.KindUint64:
		return strconv.AppendUint(b, v.Uint64(), 10)
	case slog.KindFloat64:
		return strconv.AppendFloat(b, v.Float64(), 'f', -1, 64)
	case slog.KindBool:
		return strconv.AppendBool(b, v.Bool())
	}
	s := v.String()
	bare := s != ""
	for i := 0; bare && i < len(s); i++ {
		c := s[i]
		bare = c > ' ' && c < 0x7f && c != '"' && c != '\\' && c != '='
	}
	if bare {
		return append(b, s...)
	}
	b = append(b, '"')
	b = appendEscaped(b, s)
	return append(b, '"')
}
