package h2proxy

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/textproto"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/rl-tproxy/rl-tproxy/pkg/exchange"
	"github.com/rl-tproxy/rl-tproxy/pkg/httpparse"
)

var copyBufs = sync.Pool{New: func() any { b := make([]byte, 32<<10); return &b }}

// forward sends an admitted stream upstream and relays the response, both
// directions at once (gRPC client, server and bidirectional streams).
//
// Sending and relaying are separate calls so that send's frame (the
// upstream request is built on it) is off the stack while relay runs: the
// codec starts each stream's handler on a new goroutine, and a stack
// that stays within its first size is not copied to a larger one.
func (st *stream) forward(w http.ResponseWriter, r *http.Request, d *exchange.Decision) {
	if st.watch(w) {
		defer st.unwatch() // on every way out, the relay's panic too
	}
	res := st.send(w, r, d)
	if res == nil {
		return
	}
	defer func() { _ = res.Body.Close() }()
	st.relay(w, r, res, d)
}

// send sends the request upstream and returns the response head, or nil
// when it answered the stream itself (an error). Building the request
// and answering a failure are functions of their own (not inlined): the
// request template and the error formatting are then not part of send's
// frame while the round trip runs below it on the handler's stack.
func (st *stream) send(w http.ResponseWriter, r *http.Request, d *exchange.Decision) *http.Response {
	h := st.h
	up, err := h.upstream()
	if err != nil {
		st.res.UpstreamErr = err
		st.fail(w, http.StatusBadGateway)
		return nil
	}
	out := st.upstreamRequest(r, d)
	st.res.Upstream = h.svc.Upstream
	upStart := h.now()
	res, err := up.rt.RoundTrip(out)
	if err != nil {
		st.sendFailed(w, r, err)
		return nil
	}
	st.res.UpstreamStatus = res.StatusCode
	st.res.UpstreamTTFB = h.now().Sub(upStart)
	return res
}

// upstreamRequest is the request sent upstream for r.
//
//go:noinline
func (st *stream) upstreamRequest(r *http.Request, d *exchange.Decision) *http.Request {
	svc := st.h.svc
	u := &url.URL{Scheme: "http", Host: svc.Upstream, Path: r.URL.Path, RawPath: r.URL.RawPath, RawQuery: r.URL.RawQuery}
	if r.URL.Path == "*" {
		u = &url.URL{Scheme: "http", Host: svc.Upstream, Opaque: "*"}
	}
	// The template stays on this goroutine's stack: WithContext below
	// makes the one copy that goes upstream.
	tmpl := http.Request{
		Method:        r.Method,
		URL:           u,
		Proto:         "HTTP/2.0",
		ProtoMajor:    2,
		Header:        outHeader(r, st, d),
		Host:          r.Host,
		ContentLength: r.ContentLength,
		Trailer:       r.Trailer,
	}
	// A stream that ended with its header block has ContentLength 0 (the
	// codec still hands a non-nil, empty Body): sending NoBody lets the
	// upstream request end with its HEADERS frame instead of an extra
	// empty DATA frame.
	if r.Body == nil || r.Body == http.NoBody || (r.ContentLength == 0 && len(r.Trailer) == 0) {
		tmpl.Body = http.NoBody
	} else {
		st.body = new(bodyCount)
		tmpl.Body = &bodyReader{r: r.Body, st: st.body, max: svc.MaxBodyBytes}
		if st.wd != nil {
			st.wd.setBody(st.body)
		}
	}
	// The client's stream context: a client that resets or goes away
	// resets the upstream stream (or closes the HTTP/1.1 upstream
	// connection). The response head's timeout is the transport's, from
	// the end of the request body (the h2c transport's
	// ResponseHeaderTimeout, h1client's HeadTimeout), and a relay that
	// ends early closes the response body, which ends the upstream
	// exchange too.
	return tmpl.WithContext(r.Context())
}

// sendFailed answers a stream whose round trip failed.
//
//go:noinline
func (st *stream) sendFailed(w http.ResponseWriter, r *http.Request, err error) {
	svc := st.h.svc
	switch {
	case r.Context().Err() != nil:
		st.res.ClientAborted = true
	case st.body != nil && st.body.tooBig.Load():
		st.fail(w, http.StatusRequestEntityTooLarge)
	case isHeadTimeout(err):
		st.res.UpstreamErr = fmt.Errorf("upstream %s: no response head within %s", svc.Upstream,
			svc.UpstreamTimeoutOrDefault())
		st.fail(w, http.StatusGatewayTimeout)
	default:
		st.res.UpstreamErr = fmt.Errorf("upstream %s: %w", svc.Upstream, err)
		st.fail(w, http.StatusBadGateway)
	}
}

// isHeadTimeout reports whether a RoundTrip error is the transport's
// response-head timeout (not a dial that timed out: that is a 502).
func isHeadTimeout(err error) bool {
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "dial" {
		return false
	}
	var te interface{ Timeout() bool }
	return errors.As(err, &te) && te.Timeout()
}

// outHeader is the upstream request's header: the client's fields (the
// connection-specific ones never get here: malformed.go) plus the forwarding
// fields of the service (naming st.req.Remote, the client admission saw) and the hook's (d.Forward, replacing the
// client's). When none of that changes anything, it is the client's
// header itself, shared read-only (the codec does not touch it once the
// handler runs, and the upstream side only reads it). Otherwise it is a
// new map built in one pass: the client's value slices are shared
// (capacity-capped, so that an append copies), the connection-specific
// fields are left out rather than deleted from a clone, and the hook's
// fields go in with one allocation for their values.
func outHeader(r *http.Request, st *stream, d *exchange.Decision) http.Header {
	svc := st.h.svc
	var fwd []httpparse.Header
	if d != nil {
		fwd = d.Forward
	}
	if r.Header != nil && !svc.AddsForwarding() && len(fwd) == 0 && !hasHopByHop(r.Header) {
		return r.Header
	}
	out := make(http.Header, len(r.Header)+len(fwd)+2)
	for k, vs := range r.Header {
		if !isHopByHop(k, vs) {
			out[k] = vs[:len(vs):len(vs)]
		}
	}
	var vb [64]byte
	for _, ff := range exchange.ForwardFields {
		if !svc.Adds(ff) {
			continue
		}
		k := ff.Key()
		v := string(ff.AppendValue(vb[:0], st.req.Remote.Addr()))
		if prior := out[k]; ff.AppendsPrior() && len(prior) > 0 {
			v = strings.Join(prior, ", ") + ", " + v
		}
		out[k] = []string{v}
	}
	addForward(out, fwd)
	return out
}

// addForward puts the hook's fields into h, each name's values replacing
// the client's (as Del of every name, then Add of every field).
func addForward(h http.Header, fwd []httpparse.Header) {
	if len(fwd) == 0 {
		return
	}
	var kbuf [8]string
	keys := kbuf[:0]
	vals := make([]string, len(fwd))
	for i, f := range fwd {
		k := textproto.CanonicalMIMEHeaderKey(string(f.Name))
		vals[i] = string(f.Value)
		if slices.Contains(keys, k) { // a later field of a name already replaced
			h[k] = append(h[k], vals[i])
			continue
		}
		keys = append(keys, k)
		h[k] = vals[i : i+1 : i+1]
	}
}

// isHopByHop reports whether the client's field k (a canonical key,
// values vs) stays off the upstream request: exchange.HopByHop (which
// HTTP/2 forbids on the wire, RFC 9113 8.2.2) and HTTP2-Settings, but a
// TE whose first value is "trailers" (RFC 9113 8.2.2 allows that one,
// and gRPC needs it).
func isHopByHop(k string, vs []string) bool {
	if k == exchange.HTTP2Settings {
		return true
	}
	if !exchange.IsHopByHop(k) {
		return false
	}
	return k != "Te" || len(vs) == 0 || !strings.EqualFold(vs[0], "trailers")
}

// relay writes the upstream response: head, body as it arrives (flushed
// per read, so streams stay live), then trailers. A response that ends
// with its head (a gRPC trailers-only answer) is written as one HEADERS
// frame with END_STREAM. An upstream that resets mid-body makes the proxy
// reset the client's stream.
func (st *stream) relay(w http.ResponseWriter, r *http.Request, res *http.Response, d *exchange.Decision) {
	hdr := w.Header()
	for k, vs := range res.Header {
		hdr[k] = vs
	}
	dropConnectionFields(hdr)
	for _, k := range exchange.HopByHop {
		delete(hdr, k)
	}
	delete(hdr, exchange.HTTP2Settings)
	if d != nil {
		for _, f := range d.Header {
			hdr.Add(string(f.Name), string(f.Value))
		}
	}
	w.WriteHeader(res.StatusCode)
	st.res.Status = res.StatusCode
	// The codec's writer flushes itself; a controller (an allocation)
	// only for another writer.
	fe, _ := w.(interface{ FlushError() error })
	var rc *http.ResponseController
	if fe == nil {
		rc = http.NewResponseController(w)
	}
	flush := func() error {
		if fe != nil {
			return fe.FlushError()
		}
		return rc.Flush()
	}
	// Flush the head at once only when the body's end is unknown (a
	// stream: the client must see the head before the first message).
	// A known-length body follows promptly; its last bytes are not
	// flushed either, so head, body and END_STREAM leave in one write.
	if res.ContentLength < 0 {
		_ = flush()
	}
	left := res.ContentLength
	bp := copyBufs.Get().(*[]byte)
	defer copyBufs.Put(bp)
	buf := *bp
	for {
		n, rerr := res.Body.Read(buf)
		if n > 0 {
			st.wd.writeStart()
			m, werr := w.Write(buf[:n])
			st.res.BytesOut += int64(m)
			left -= int64(n)
			if werr == nil && left != 0 { // left < 0: unknown length
				werr = flush()
			}
			st.wd.writeEnd()
			if werr != nil {
				st.res.ClientAborted = true
				st.res.End = st.h.now()
				return // the deferred cancel resets the upstream stream
			}
		}
		if rerr != nil {
			st.res.End = st.h.now()
			if errors.Is(rerr, context.Canceled) && r.Context().Err() != nil {
				st.res.ClientAborted = true
				return
			}
			if !errors.Is(rerr, io.EOF) {
				st.res.UpstreamErr = fmt.Errorf("upstream %s: response body: %w", st.h.svc.Upstream, rerr)
				// The documented way to reset the client's stream
				// (RST_STREAM INTERNAL_ERROR) from a handler.
				panic(http.ErrAbortHandler)
			}
			break
		}
	}
	for k, vs := range res.Trailer {
		hdr[http.TrailerPrefix+k] = vs
	}
}

// fail answers a stream whose forwarding failed before a response head.
func (st *stream) fail(w http.ResponseWriter, status int) {
	if st.grpc {
		code := grpcUnavailable
		switch status {
		case http.StatusRequestEntityTooLarge:
			code = grpcResourceExhausted
		case http.StatusGatewayTimeout:
			code = grpcDeadlineExceeded
		}
		st.grpcAnswer(w, code, strings.ToLower(http.StatusText(status)), -1, nil)
		return
	}
	st.answer(w, status, nil, []byte(strconv.Itoa(status)+" "+http.StatusText(status)+"\n"), "text/plain; charset=utf-8")
}

// dropConnectionFields deletes the fields h's Connection values name: an
// HTTP/1.1 upstream's connection-specific fields (RFC 9110 7.6.1), never
// the message's. One pass over the values, one map delete per option.
func dropConnectionFields(h http.Header) {
	for _, v := range h["Connection"] {
		for v != "" {
			var o string
			o, v, _ = strings.Cut(v, ",")
			if o = strings.Trim(o, " \t"); o != "" {
				delete(h, http.CanonicalHeaderKey(o))
			}
		}
	}
}

// hasHopByHop reports whether outHeader would leave a field of h out.
func hasHopByHop(h http.Header) bool {
	for _, k := range exchange.HopByHop {
		if vs, ok := h[k]; ok && isHopByHop(k, vs) {
			return true
		}
	}
	_, ok := h[exchange.HTTP2Settings]
	return ok
}
