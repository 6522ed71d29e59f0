package proxy

import (
	"net/http"
	"net/netip"
	"strconv"

	"github.com/rl-tproxy/rl-tproxy/pkg/exchange"
	"github.com/rl-tproxy/rl-tproxy/pkg/httpparse"
)

// connDrop holds the field names a head's Connection fields list (RFC 9110
// 7.6.1: the sender's connection-specific fields, never forwarded),
// collected once per head so that each field costs a comparison per
// option instead of a scan of every Connection field. Options naming
// fields exchange.IsHopByHop drops anyway are left out: the common
// "Connection: keep-alive" leaves nothing to compare.
type connDrop struct {
	buf  [httpparse.MaxConnectionOptions][]byte
	n    int  // options in buf
	slow bool // more options than the parser accepts: scan per field
}

func (d *connDrop) init(hs []httpparse.Header) {
	list, ok := httpparse.ConnectionOptions(d.buf[:0], hs)
	d.slow = !ok
	n := 0
	for _, o := range list {
		if !exchange.IsHopByHop(o) {
			d.buf[n] = o
			n++
		}
	}
	d.n = n
}

// names reports whether name is listed (hs: the head init saw).
func (d *connDrop) names(hs []httpparse.Header, name []byte) bool {
	if d.slow {
		return httpparse.ConnectionHas(hs, name)
	}
	for _, o := range d.buf[:d.n] {
		if httpparse.EqualFoldBytes(o, name) {
			return true
		}
	}
	return false
}

func appendHeader(b []byte, name string, value []byte) []byte {
	b = append(b, name...)
	b = append(b, ':', ' ')
	b = append(b, value...)
	return append(b, '\r', '\n')
}

func appendHeaderBytes(b, name, value []byte) []byte {
	b = append(b, name...)
	b = append(b, ':', ' ')
	b = append(b, value...)
	return append(b, '\r', '\n')
}

// appendRequestHead serialises the head sent upstream: the request line in
// HTTP/1.1 with an origin-form target, exactly one Host (the one admission
// saw), the client's end-to-end fields, the forwarding fields the service
// asks for (exchange.ForwardFields, naming client), and exactly one
// framing field chosen by the proxy.
// Dropped: hop-by-hop fields and every field named in Connection (except
// the routing and framing fields, which Connection cannot remove),
// Content-Length/Transfer-Encoding (re-emitted), Expect (the proxy answers
// 100 Continue itself after admission), and the forwarding fields the
// proxy rewrites, and the fields of add, which are appended instead. On an
// upgrade, Upgrade and "Connection: upgrade" pass.
func appendRequestHead(b []byte, h *httpparse.Request, svc *exchange.Service, client netip.AddrPort, add []httpparse.Header) []byte {
	b = append(b, h.Method...)
	b = append(b, ' ')
	b = appendOriginTarget(b, h)
	b = append(b, " HTTP/1.1\r\n"...)
	var conn connDrop
	conn.init(h.Headers)
	var prior uint8 // bit f: the client sent forwarding field f the service appends to
	// RFC 9112 3.2.2: the authority of an absolute-form target replaces
	// the Host field; h.Host is that authority or the Host field, the
	// value the Hook matched and rendered. HTTP/1.0 without Host: the
	// upstream (HTTP/1.1) needs one.
	host := h.Host
	if len(host) == 0 && h.HostHeader == nil {
		host = []byte(svc.Upstream)
	}
	b = appendHeader(b, "Host", host)
	for i := range h.Headers {
		f := &h.Headers[i]
		n := f.Name
		if exchange.IsHopByHop(n) || !routing(n) && conn.names(h.Headers, n) || len(add) > 0 && named(add, n) {
			continue
		}
		switch len(n) {
		case 4:
			if httpparse.EqualFold(n, "host") {
				continue // written above
			}
		case 6:
			if httpparse.EqualFold(n, "expect") {
				continue
			}
		case 14:
			if httpparse.EqualFold(n, "content-length") {
				continue
			}
		}
		if ff := exchange.ForwardFieldOf(n); ff != 0 && svc.Adds(ff) {
			prior |= 1 << ff
			continue
		}
		b = appendHeaderBytes(b, n, f.Value)
	}
	if h.Upgrade {
		if v, ok := h.Header("upgrade"); ok {
			b = appendHeader(b, "Upgrade", v)
			b = append(b, "Connection: upgrade\r\n"...)
		}
	}
	for _, ff := range exchange.ForwardFields {
		if !svc.Adds(ff) {
			continue
		}
		b = append(b, ff.Name()...)
		b = append(b, ':', ' ')
		if ff.AppendsPrior() && prior&(1<<ff) != 0 {
			b = appendJoined(b, h.Headers, ff.Name())
			b = append(b, ", "...)
		}
		b = ff.AppendValue(b, client.Addr())
		b = append(b, '\r', '\n')
	}
	for i := range add {
		b = appendHeaderBytes(b, add[i].Name, add[i].Value)
	}
	switch h.BodyMode() {
	case httpparse.BodyChunked:
		b = append(b, "Transfer-Encoding: chunked\r\n"...)
	case httpparse.BodyLength:
		b = append(b, "Content-Length: "...)
		b = strconv.AppendInt(b, h.ContentLength, 10)
		b = append(b, '\r', '\n')
	}
	return append(b, '\r', '\n')
}

// routing reports the fields that frame or route a request, which a
// client cannot remove by naming them in Connection (the proxy writes Host
// and the framing field itself; this keeps it so if that ever changes).
func routing(name []byte) bool {
	switch len(name) {
	case 4:
		return httpparse.EqualFold(name, "host")
	case 14:
		return httpparse.EqualFold(name, "content-length")
	case 17:
		return httpparse.EqualFold(name, "transfer-encoding")
	}
	return false
}

// appendOriginTarget appends the target in origin form: an absolute-form
// target loses its scheme and authority (which became h.Host), keeping
// path and query ("/" for an empty path, "*" for OPTIONS). Other forms are
// copied.
func appendOriginTarget(b []byte, h *httpparse.Request) []byte {
	t := h.Target
	if len(t) == 0 || t[0] == '/' || t[0] == '*' || httpparse.EqualFold(h.Method, "CONNECT") {
		return append(b, t...)
	}
	path, query := splitTarget(t)
	switch {
	case len(path) > 0:
		b = append(b, path...)
	case httpparse.EqualFold(h.Method, "OPTIONS") && query == nil:
		return append(b, '*')
	default:
		b = append(b, '/')
	}
	if query != nil {
		b = append(b, '?')
		b = append(b, query...)
	}
	return b
}

// named reports whether hs has a field called name (case-insensitive).
func named(hs []httpparse.Header, name []byte) bool {
	for i := range hs {
		if httpparse.EqualFoldBytes(hs[i].Name, name) {
			return true
		}
	}
	return false
}

// appendJoined appends the non-empty values of every field named name
// (any case), joined by ", ".
func appendJoined(b []byte, hs []httpparse.Header, name string) []byte {
	first := true
	for i := range hs {
		if !httpparse.EqualFold(hs[i].Name, name) || len(hs[i].Value) == 0 {
			continue
		}
		if !first {
			b = append(b, ", "...)
		}
		first = false
		b = append(b, hs[i].Value...)
	}
	return b
}

// appendStatusLine appends "HTTP/1.1 CODE REASON\r\n".
func appendStatusLine(b []byte, status int, reason []byte) []byte {
	b = append(b, "HTTP/1.1 "...)
	b = strconv.AppendInt(b, int64(status), 10)
	b = append(b, ' ')
	if reason != nil {
		b = append(b, reason...)
	} else {
		b = append(b, http.StatusText(status)...)
	}
	return append(b, '\r', '\n')
}

// respFlags say how appendResponseHead frames the head sent to the client.
type respFlags uint8

const (
	// respChunked: the body goes out chunked (re-encoded by the proxy).
	respChunked respFlags = 1 << iota
	// respUpgrade: a 101; Upgrade and "Connection: upgrade" pass.
	respUpgrade
	// respClose: the client connection ends after this response.
	respClose
)

// appendResponseHead serialises the head sent to the client: status line
// in HTTP/1.1, the upstream's end-to-end fields (hop-by-hop and
// Connection-named ones dropped), the Decision's extra fields, the framing
// the proxy chose and Connection: close when the client connection ends.
func appendResponseHead(b []byte, r *httpparse.Response, extra []httpparse.Header, flags respFlags) []byte {
	b = appendStatusLine(b, r.Status, r.Reason)
	var conn connDrop
	conn.init(r.Headers)
	for i := range r.Headers {
		f := &r.Headers[i]
		n := f.Name
		if exchange.IsHopByHop(n) || conn.names(r.Headers, n) {
			continue
		}
		b = appendHeaderBytes(b, n, f.Value)
	}
	for i := range extra {
		b = appendHeaderBytes(b, extra[i].Name, extra[i].Value)
	}
	switch {
	case flags&respUpgrade != 0:
		if v, ok := r.Header("upgrade"); ok {
			b = appendHeader(b, "Upgrade", v)
		}
		b = append(b, "Connection: upgrade\r\n"...)
	case flags&respChunked != 0:
		b = append(b, "Transfer-Encoding: chunked\r\n"...)
	}
	if flags&respClose != 0 && flags&respUpgrade == 0 {
		b = append(b, "Connection: close\r\n"...)
	}
	return append(b, '\r', '\n')
}
