package h2proxy

import (
	"bytes"
	"errors"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rl-tproxy/rl-tproxy/pkg/exchange"
	"github.com/rl-tproxy/rl-tproxy/pkg/httpparse"
)

// handler serves request streams; the connection's service and
// configuration come with the request's context.
type handler struct {
	srv *Server
}

// conn is the per-stream view of the connection.
type conn struct {
	srv           *Server
	svc           *exchange.Service
	cfg           *exchange.Config
	remote, local netip.AddrPort
	peer          netip.AddrPort // the TCP peer when a PROXY header named remote
	hc            *h2conn
}

// stream is one request stream: what the Hook sees and what it is told.
// Streams are pooled (streams): the Hook contract lets the proxy reuse
// the Request, Decision and Result once Done returned, and nothing else
// refers to a stream after its handler returned (the request body's
// counters, which the upstream's body writer may still touch, live in
// bodyCount).
type stream struct {
	h     *conn
	head  httpparse.Request
	req   exchange.Request
	dec   exchange.Decision
	res   exchange.Result
	grpc  bool
	body  *bodyCount             // nil for a request without a body
	arena []byte                 // the bytes head's slices point into
	adm   admission              // the Hook's Admit call (admit.go)
	actx  *exchange.AdmitContext // a ContextBound Hook's Admit context, kept by putStream
	wd    *idleWatch             // the stream's idle timeouts (idle.go), kept by putStream
}

// bodyCount counts a request body as the upstream reads it.
type bodyCount struct {
	in atomic.Int64 // request body bytes (read by the upstream's writer)
	// tooBig is set when the body went over MaxBodyBytes.
	tooBig atomic.Bool
	// reading: a read of the client's body is waiting; lastRead: mono()
	// when the last read started or ended (idle.go).
	reading  atomic.Bool
	lastRead atomic.Int64
}

var streams = sync.Pool{New: func() any { return new(stream) }}

// maxPooledArena bounds the header bytes a pooled stream keeps.
const maxPooledArena = 8 << 10

func getStream(h *conn) *stream {
	st := streams.Get().(*stream)
	st.h = h
	return st
}

func putStream(st *stream) {
	arena := st.arena[:0]
	if cap(arena) > maxPooledArena {
		arena = nil
	}
	hs := st.head.Headers[:0]
	if cap(hs) > 64 {
		hs = nil
	}
	clear(st.head.Headers[:cap(st.head.Headers)])
	ch, fn, actx, wd := st.adm.ch, st.adm.fn, st.actx, st.wd
	*st = stream{arena: arena, actx: actx, wd: wd}
	st.head.Headers = hs
	st.adm.ch, st.adm.fn = ch, fn
	streams.Put(st)
}

func (st *stream) bytesIn() int64 {
	if st.body == nil {
		return 0
	}
	return st.body.in.Load()
}

func addrPort(a net.Addr) netip.AddrPort {
	if ta, ok := a.(*net.TCPAddr); ok {
		ap := ta.AddrPort()
		return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
	}
	if a != nil {
		if ap, err := netip.ParseAddrPort(a.String()); err == nil {
			return ap
		}
	}
	return netip.AddrPort{}
}

func (h *conn) now() time.Time {
	if h.cfg.Now != nil {
		return h.cfg.Now()
	}
	return time.Now()
}

// ServeHTTP admits one request stream, then denies or forwards it. It runs
// when the stream's header block is complete; the codec holds back at most
// the stream's flow-control window of body (Service.H2.StreamWindow) and
// nothing is sent upstream before the Hook allowed.
func (hd *handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	hc, ok := r.Context().Value(connKey{}).(*h2conn)
	if !ok { // not a handed-off connection: cannot happen
		w.WriteHeader(http.StatusInternalServerError)
		return
	}
	h := hc.view(hd.srv)
	st := getStream(h)
	st.build(r)
	if status, rule := st.check(r); status != 0 {
		st.reject(w, status, rule)
		putStream(st)
		return
	}
	hook := h.cfg.Hook
	if hook == nil {
		defer putStream(st)
		st.forward(w, r, nil)
		return
	}
	if !st.admit(hook, w, r) {
		return // answered; Admit's late return finishes st (admit.go)
	}
	defer putStream(st) // after Done (deferred below)
	defer st.done(hook)
	switch {
	case st.res.AdmissionErr != nil: // answered 503
	case r.Context().Err() != nil:
		st.res.ClientAborted = true
	case !st.dec.Allow:
		st.deny(w, &st.dec)
	default:
		st.forward(w, r, &st.dec)
	}
}

// The handler's stack: the codec starts every stream's handler on a new
// goroutine, whose stack starts at the runtime's adaptive size and is
// copied to a twice larger one whenever a call goes past its end. What
// is not on the forwarding path (rejects, the Hook's calls with their
// large results) runs in functions of its own, not inlined, so that
// their frames are not part of ServeHTTP's while the upstream round trip
// runs below it.

// reject answers a stream that failed check.
//
//go:noinline
func (st *stream) reject(w http.ResponseWriter, status int, rule string) {
	h := st.h
	h.cfg.ReportReject(h.svc, h.remote, rule, status)
	h.cfg.Log().Debug("http2 request rejected", "service", h.svc.Name, "remote", h.remote, "rule", rule)
	st.answer(w, status, nil, []byte(http.StatusText(status)+"\n"), "text/plain; charset=utf-8")
}

// done tells the Hook how the stream ended.
//
//go:noinline
func (st *stream) done(hook exchange.Hook) {
	if st.res.End.IsZero() {
		st.res.End = st.h.now()
	}
	st.res.BytesIn = st.bytesIn()
	hook.Done(&st.req, &st.dec, &st.res)
}

// build fills the Hook's view of the stream: :method, :path (split at
// '?'), :authority as the host, and the header fields.
func (st *stream) build(r *http.Request) {
	h := st.h
	hd := &st.head
	hd.Reset()
	n, size := 0, len(r.Method)+len(r.RequestURI)+len(r.Host)
	for k, vs := range r.Header {
		n += len(vs)
		for _, v := range vs {
			size += len(k) + len(v)
		}
	}
	// One arena for every byte the head refers to: no allocation per
	// field once the pooled stream's arena is large enough.
	if cap(st.arena) < size {
		st.arena = make([]byte, 0, size)
	}
	a := st.arena[:0]
	a, hd.Method = appendField(a, r.Method, false)
	a, hd.Target = appendField(a, r.RequestURI, false)
	a, hd.Host = appendField(a, r.Host, false)
	hd.Minor = 1
	hd.HostHeader = hd.Host
	hd.ContentLength = r.ContentLength
	hs := hd.Headers[:0]
	if cap(hs) < n {
		hs = make([]httpparse.Header, 0, n)
	}
	for k, vs := range r.Header {
		var name []byte
		a, name = appendField(a, k, true)
		for _, v := range vs {
			var val []byte
			a, val = appendField(a, v, false)
			hs = append(hs, httpparse.Header{Name: name, Value: val})
		}
	}
	st.arena = a
	hd.Headers = hs
	path, query := hd.Target, []byte(nil)
	if i := bytes.IndexByte(path, '?'); i >= 0 {
		path, query = path[:i], path[i+1:]
	}
	st.req = exchange.Request{Remote: h.remote, Local: h.local, Peer: h.peer, Service: h.svc, Head: hd, Path: path, Query: query, Start: h.now(), Proto: exchange.ProtoH2}
	st.grpc = isGRPC(r.Header.Get("Content-Type"))
}

// appendField appends s to a (ASCII-lowercased with lower) and returns a
// and the appended bytes, capacity-capped so that a later append to the
// field cannot overwrite its neighbour.
func appendField(a []byte, s string, lower bool) ([]byte, []byte) {
	i := len(a)
	a = append(a, s...)
	if lower {
		for j := i; j < len(a); j++ {
			if c := a[j]; 'A' <= c && c <= 'Z' {
				a[j] = c + 'a' - 'A'
			}
		}
	}
	return a, a[i:len(a):len(a)]
}

// isGRPC reports whether a content type is gRPC's (application/grpc,
// application/grpc+proto, application/grpc-web...).
func isGRPC(ct string) bool {
	return len(ct) >= 16 && strings.EqualFold(ct[:16], "application/grpc")
}

// check applies the limits the codec does not: field count, body size
// announced, the methods the proxy does not forward, and the service's
// rule on escaped slashes in the path (the one HTTP/1.x applies).
func (st *stream) check(r *http.Request) (int, string) {
	svc := st.h.svc
	max := svc.Limits.MaxHeaders
	if max <= 0 {
		max = 100
	}
	if len(st.head.Headers) > max {
		return http.StatusRequestHeaderFieldsTooLarge, "too-many-headers"
	}
	if r.Method == http.MethodConnect {
		return http.StatusNotImplemented, "h2-connect-unsupported"
	}
	if svc.MaxBodyBytes > 0 && r.ContentLength > svc.MaxBodyBytes {
		return http.StatusRequestEntityTooLarge, "body-too-large"
	}
	return exchange.CheckPath(svc, st.req.Path)
}

// answer writes a complete response from the proxy itself.
func (st *stream) answer(w http.ResponseWriter, status int, hs []httpparse.Header, body []byte, ctype string) {
	h := w.Header()
	for _, f := range hs {
		h.Add(string(f.Name), string(f.Value))
	}
	if ctype != "" {
		h.Set("Content-Type", ctype)
	}
	own := st.watch(w)
	wd := st.wd
	w.WriteHeader(status)
	wd.writeStart()
	n, _ := w.Write(body)
	if fe, ok := w.(interface{ FlushError() error }); ok {
		_ = fe.FlushError() // under the send timeout: a client that takes nothing is reset
	}
	wd.writeEnd()
	st.res.Status = status
	st.res.BytesOut += int64(n)
	st.res.End = st.h.now()
	if own {
		st.unwatch()
	}
}

// watch arms the stream's idle timeouts (idle.go) on w; false when they
// were armed already (the caller that armed them disarms them).
func (st *stream) watch(w http.ResponseWriter) bool {
	if st.wd == nil {
		st.wd = &idleWatch{}
	}
	return st.wd.arm(w, nil, st.h.svc.IdleTimeoutOrDefault())
}

// unwatch disarms the idle timeouts; when one fired, the stream was
// reset: the exchange counts as abandoned by the client (no report) and
// the rule is counted as a rejection.
func (st *stream) unwatch() {
	rule := st.wd.disarm()
	if rule == "" {
		return
	}
	h := st.h
	st.res.ClientAborted = true
	st.res.UpstreamErr = nil
	if st.res.End.IsZero() {
		st.res.End = h.now()
	}
	h.cfg.ReportReject(h.svc, h.remote, rule, 0)
	h.cfg.Log().Debug("http2 stream idle", "service", h.svc.Name, "remote", h.remote, "rule", rule)
}

// bodyReader is the request body as the upstream reads it: counted and
// bounded by MaxBodyBytes.
type bodyReader struct {
	r   interface{ Read([]byte) (int, error) }
	st  *bodyCount
	max int64
}

var errBodyTooLarge = errors.New("request body over max_body_bytes")

func (b *bodyReader) Read(p []byte) (int, error) {
	b.st.lastRead.Store(mono())
	b.st.reading.Store(true)
	n, err := b.r.Read(p)
	b.st.reading.Store(false)
	b.st.lastRead.Store(mono())
	if b.max > 0 && b.st.in.Add(int64(n)) > b.max {
		b.st.tooBig.Store(true)
		return 0, errBodyTooLarge
	}
	if b.max <= 0 {
		b.st.in.Add(int64(n))
	}
	return n, err
}

func (b *bodyReader) Close() error { return nil }
