package h2proxy

import (
	"bytes"
	"context"
	"errors"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rl-tproxy/rl-tproxy/pkg/httpparse"
	"github.com/rl-tproxy/rl-tproxy/pkg/proxy"
)

// handler serves request streams; the connection's service and
// configuration come with the request's context.
type handler struct {
	srv *Server
}

// conn is the per-stream view of the connection.
type conn struct {
	srv           *Server
	svc           *proxy.Service
	cfg           *proxy.Config
	remote, local netip.AddrPort
	hc            *h2conn
}

// stream is one request stream: what the Hook sees and what it is told.
type stream struct {
	h    *conn
	head httpparse.Request
	req  proxy.Request
	res  proxy.Result
	grpc bool
	in   atomic.Int64 // request body bytes (read by the upstream's writer)
	// tooBig is set when the body went over MaxBodyBytes.
	tooBig atomic.Bool
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
	h := &conn{srv: hd.srv, svc: hc.svc, cfg: hc.cfg, remote: addrPort(hc.RemoteAddr()), local: addrPort(hc.LocalAddr()), hc: hc}
	st := &stream{h: h}
	st.build(r)
	if status, rule := st.check(r); status != 0 {
		if h.cfg.OnReject != nil {
			h.cfg.OnReject(h.svc, h.remote, rule, status)
		}
		if rj, ok := h.cfg.Hook.(proxy.Rejecter); ok {
			rj.Reject(h.svc, h.remote, rule, status)
		}
		logger(h.cfg).Debug("http2 request rejected", "service", h.svc.Name, "remote", h.remote, "rule", rule)
		st.answer(w, status, nil, []byte(http.StatusText(status)+"\n"), "text/plain; charset=utf-8")
		return
	}
	hook := h.cfg.Hook
	if hook == nil {
		st.forward(w, r, nil)
		return
	}
	d := hook.Admit(r.Context(), &st.req)
	defer func() {
		if st.res.End.IsZero() {
			st.res.End = h.now()
		}
		st.res.BytesIn = st.in.Load()
		hook.Done(&st.req, &d, &st.res)
	}()
	if r.Context().Err() != nil {
		st.res.ClientAborted = true
		return
	}
	if !d.Allow {
		st.deny(w, &d)
		return
	}
	st.forward(w, r, &d)
}

// build fills the Hook's view of the stream: :method, :path (split at
// '?'), :authority as the host, and the header fields.
func (st *stream) build(r *http.Request) {
	h := st.h
	hd := &st.head
	hd.Reset()
	hd.Method = []byte(r.Method)
	hd.Target = []byte(r.RequestURI)
	hd.Minor = 1
	hd.Host = []byte(r.Host)
	hd.HostHeader = hd.Host
	hd.ContentLength = r.ContentLength
	n := 0
	for _, vs := range r.Header {
		n += len(vs)
	}
	hs := make([]httpparse.Header, 0, n)
	for k, vs := range r.Header {
		name := []byte(strings.ToLower(k))
		for _, v := range vs {
			hs = append(hs, httpparse.Header{Name: name, Value: []byte(v)})
		}
	}
	hd.Headers = hs
	path, query := hd.Target, []byte(nil)
	if i := bytes.IndexByte(path, '?'); i >= 0 {
		path, query = path[:i], path[i+1:]
	}
	st.req = proxy.Request{Remote: h.remote, Local: h.local, Service: h.svc, Head: hd, Path: path, Query: query, Start: h.now(), Proto: proxy.ProtoH2}
	st.grpc = isGRPC(r.Header.Get("Content-Type"))
}

// isGRPC reports whether a content type is gRPC's (application/grpc,
// application/grpc+proto, application/grpc-web...).
func isGRPC(ct string) bool {
	return len(ct) >= 16 && strings.EqualFold(ct[:16], "application/grpc")
}

// check applies the limits the codec does not: field count, body size
// announced, and the methods the proxy does not forward.
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
	return 0, ""
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
	w.WriteHeader(status)
	n, _ := w.Write(body)
	st.res.Status = status
	st.res.BytesOut += int64(n)
	st.res.End = st.h.now()
}

// bodyReader is the request body as the upstream reads it: counted,
// bounded by MaxBodyBytes, and arming the response-head timeout at its
// end.
type bodyReader struct {
	r     interface{ Read([]byte) (int, error) }
	st    *stream
	max   int64
	onEOF func()
}

var errBodyTooLarge = errors.New("request body over max_body_bytes")

func (b *bodyReader) Read(p []byte) (int, error) {
	n, err := b.r.Read(p)
	if b.max > 0 && b.st.in.Add(int64(n)) > b.max {
		b.st.tooBig.Store(true)
		return 0, errBodyTooLarge
	}
	if b.max <= 0 {
		b.st.in.Add(int64(n))
	}
	if err != nil && b.onEOF != nil {
		b.onEOF()
	}
	return n, err
}

func (b *bodyReader) Close() error { return nil }

// headTimer cancels an exchange whose response head does not arrive within
// the upstream timeout after the request body ended (a streaming request
// may legitimately wait for its response head until its body ends).
type headTimer struct {
	mu      sync.Mutex
	d       time.Duration
	cancel  context.CancelFunc
	t       *time.Timer
	stopped bool
}

func (t *headTimer) arm() {
	t.mu.Lock()
	defer t.mu.Unlock()
	if !t.stopped && t.t == nil {
		t.t = time.AfterFunc(t.d, t.cancel)
	}
}

func (t *headTimer) stop() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.stopped = true
	if t.t != nil {
		return t.t.Stop()
	}
	return true
}
