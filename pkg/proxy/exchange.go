package proxy

import (
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/rl-tproxy/rl-tproxy/pkg/httpparse"
)

// One request/response exchange on an upstream connection, in named steps:
// sendHead, sendBody, readResponseHead, then upgrade (a 101) or
// relayResponse. A step that fails returns how (an xfail); endExchange
// turns that into the connection's answer.

// unboundedBody is the length given to copyN for a close-delimited
// response body, which ends with the upstream's EOF rather than a count.
const unboundedBody = 1 << 62

// copyStep bounds one copyN round: one deadline, one splice call.
const copyStep = 1 << 20

// failKind says how an exchange step failed.
type failKind uint8

const (
	failNone     failKind = iota
	failRetry             // a reused connection broke before any response byte: replay once
	failUpstream          // the upstream failed: 502 (504 on a timeout)
	failClient            // the client went away
	failRequest           // the client's body broke a rule: 400/413
)

// xfail is a failed step (the zero value: the step succeeded).
type xfail struct {
	kind failKind
	err  error
}

// exchange runs one request/response on u. It consumes u (pooled again or
// closed) except when it returns errRetry (the caller closes u).
func (c *conn) exchange(cfg *Config, svc *Service, u *upConn, base int, retryable bool) (bool, error) {
	bodyLeft, f := c.sendHead(svc, u, retryable)
	if f.kind == failNone {
		f = c.sendBody(svc, u, base, bodyLeft)
	}
	if f.kind == failNone {
		f = c.readResponseHead(cfg, svc, u, retryable)
	}
	if f.kind != failNone {
		return c.endExchange(cfg, svc, u, f)
	}
	c.res.UpstreamStatus, c.res.UpstreamTTFB = u.resp.Status, cfg.now().Sub(c.res.upStart)
	if u.resp.Status == 101 {
		return c.upgrade(cfg, svc, u), nil
	}
	return c.relayResponse(cfg, svc, u), nil
}

// endExchange closes u after a failed step (except for a retry, which the
// caller replays) and answers the client as the failure asks.
func (c *conn) endExchange(cfg *Config, svc *Service, u *upConn, f xfail) (bool, error) {
	if f.kind == failRetry {
		return false, errRetry
	}
	u.close()
	switch f.kind {
	case failUpstream:
		return c.upstreamFail(cfg, svc, f.err), nil
	case failRequest:
		if f.err == errBodyTooLarge {
			return c.rejectRule(cfg, svc, "body-too-large", 413), nil
		}
		return c.reject(cfg, svc, f.err), nil
	}
	c.res.ClientAborted = true
	return false, nil
}

// sendHead writes the request head upstream together with as much of an
// already buffered Content-Length body as fits in the same write; it
// returns the body bytes still to send.
func (c *conn) sendHead(svc *Service, u *upConn, retryable bool) (int64, xfail) {
	h := &c.head
	b := appendRequestHead(c.getWB(), h, svc, c.remote, c.dec.Forward)
	bodyLeft := int64(0)
	if h.BodyMode() == httpparse.BodyLength {
		bodyLeft = h.ContentLength
		if avail := int64(c.buf.w - c.buf.r); avail > 0 && bodyLeft > 0 {
			k := min(avail, bodyLeft, int64(cap(b)-len(b)))
			b = append(b, c.buf.b[c.buf.r:c.buf.r+int(k)]...)
			c.buf.r += int(k)
			bodyLeft -= k
			c.res.BytesIn += k
		}
	}
	u.nc.SetDeadline(time.Now().Add(svc.upstreamTimeout()))
	if _, err := c.w.writeAll(u.nc, u.raw, b); err != nil {
		if retryable {
			return 0, xfail{kind: failRetry}
		}
		return 0, xfail{failUpstream, fmt.Errorf("send request head: %w", err)}
	}
	return bodyLeft, xfail{}
}

// sendBody streams the rest of the request body upstream: bodyLeft bytes
// of a Content-Length body, or a chunked body decoded and re-encoded.
func (c *conn) sendBody(svc *Service, u *upConn, base int, bodyLeft int64) xfail {
	idle := svc.idleTimeout()
	switch c.head.BodyMode() {
	case httpparse.BodyLength:
		return c.sendLengthBody(u, bodyLeft, idle)
	case httpparse.BodyChunked:
		c.chunk.Reset(svc.Limits)
		need := headNeed(svc.Limits)
		in, _, srcErr, dstErr := c.relayChunked(&c.buf, base, c.nc, func() (int, error) { return c.fill(need) },
			u.nc, true, idle, svc.MaxBodyBytes)
		c.res.BytesIn += in
		var pe *httpparse.Error
		switch {
		case srcErr == errBodyTooLarge || errors.As(srcErr, &pe):
			return xfail{failRequest, srcErr}
		case srcErr != nil:
			return xfail{kind: failClient}
		case dstErr != nil:
			return xfail{failUpstream, fmt.Errorf("send chunked body: %w", dstErr)}
		}
	}
	return xfail{}
}

// sendLengthBody sends the buffered rest of a Content-Length body, then
// copies what the client still has to send.
func (c *conn) sendLengthBody(u *upConn, bodyLeft int64, idle time.Duration) xfail {
	if avail := int64(c.buf.w - c.buf.r); avail > 0 && bodyLeft > 0 {
		k := min(avail, bodyLeft)
		if _, err := c.w.writeAll(u.nc, u.raw, c.buf.b[c.buf.r:c.buf.r+int(k)]); err != nil {
			return xfail{failUpstream, fmt.Errorf("send request body: %w", err)}
		}
		c.buf.r += int(k)
		bodyLeft -= k
		c.res.BytesIn += k
	}
	if bodyLeft > 0 {
		n, srcErr, dstErr := c.copyN(u.nc, c.nc, bodyLeft, idle, true)
		c.res.BytesIn += n
		if srcErr != nil {
			return xfail{kind: failClient}
		}
		if dstErr != nil {
			return xfail{failUpstream, fmt.Errorf("send request body: %w", dstErr)}
		}
	}
	return xfail{}
}

// readResponseHead reads the final response head (or a 101) into u.resp
// and consumes it from u.buf; 1xx interim responses are relayed or
// dropped on the way. From here on the client is not read until the
// response is written: the abort watcher cancels the exchange when the
// client goes away.
func (c *conn) readResponseHead(cfg *Config, svc *Service, u *upConn, retryable bool) xfail {
	h := &c.head
	c.watchResponsePhase()
	if c.attachUp(u) {
		return xfail{kind: failClient}
	}
	u.buf.get(bufSize)
	r := &u.resp
	if h.BodyMode() != httpparse.BodyNone {
		// The deadline set before the head covers the response of a
		// bodyless request; after a body, the wait starts again.
		u.nc.SetReadDeadline(time.Now().Add(svc.upstreamTimeout()))
	}
	for {
		err := r.Parse(u.buf.unread(), httpparse.Limits{}, h.Method)
		if err == httpparse.ErrNeedMore {
			if f := c.fillResponseHead(u, retryable); f.kind != failNone {
				return f
			}
			continue
		}
		if err != nil {
			return xfail{failUpstream, fmt.Errorf("parse response head: %w", err)}
		}
		if r.Status == 101 || !r.Informational() {
			u.buf.r += r.HeadLen
			return xfail{}
		}
		if f := c.relayInterim(svc, r); f.kind != failNone {
			return f
		}
		u.buf.r += r.HeadLen
		if u.buf.r == u.buf.w {
			u.buf.r, u.buf.w = 0, 0
		}
	}
}

// fillResponseHead reads more of a response head into u.buf.
func (c *conn) fillResponseHead(u *upConn, retryable bool) xfail {
	if u.buf.w == len(u.buf.b) {
		if u.buf.r == 0 {
			return xfail{failUpstream, errors.New("response head too large")}
		}
		u.buf.compact()
	}
	_, err := u.fill()
	switch {
	case err == nil:
		return xfail{}
	case c.detachUp():
		return xfail{kind: failClient}
	case retryable && u.buf.w == 0 && !isTimeout(err):
		return xfail{kind: failRetry}
	}
	return xfail{failUpstream, fmt.Errorf("read response head: %w", err)}
}

// relayInterim passes a 1xx response on to an HTTP/1.1 client, except a
// second 100 after the proxy's own.
func (c *conn) relayInterim(svc *Service, r *httpparse.Response) xfail {
	if c.head.Minor != 1 || r.Status == 100 && c.sent100 {
		return xfail{}
	}
	b := appendResponseHead(c.getWB(), r, nil, 0)
	c.nc.SetWriteDeadline(time.Now().Add(svc.idleTimeout()))
	if _, err := c.w.writeAll(c.nc, c.raw, b); err != nil {
		return xfail{kind: failClient}
	}
	return xfail{}
}

// extraHeaders are the Decision's fields added to an upstream response.
func (c *conn) extraHeaders(cfg *Config) []httpparse.Header {
	if cfg.Hook == nil {
		return nil
	}
	return c.dec.Header
}

// upgrade answers a 101 and relays bytes both ways until both end. It
// reports whether the client connection stays open (never).
func (c *conn) upgrade(cfg *Config, svc *Service, u *upConn) bool {
	r := &u.resp
	if !c.head.Upgrade || !r.Upgrade {
		u.close()
		return c.upstreamFail(cfg, svc, errors.New("101 Switching Protocols without an upgrade request"))
	}
	c.res.Status = 101
	idle := svc.idleTimeout()
	if c.watchStop() || // the tunnel reads the client
		c.writeClient(appendResponseHead(c.getWB(), r, c.extraHeaders(cfg), respUpgrade), idle) != nil {
		u.close()
		c.res.ClientAborted = true
		return false
	}
	c.tunnel(u, idle)
	return false
}

// relayState is what the response relay learns about both connections.
type relayState struct {
	upKeep   bool // the upstream connection may be pooled
	keep     bool // the client connection stays open
	released bool // u was already pooled or closed
}

// relayResponse writes the response head and body to the client and
// releases u. It reports whether the client connection stays open.
func (c *conn) relayResponse(cfg *Config, svc *Service, u *upConn) bool {
	r := &u.resp
	idle := svc.idleTimeout()
	bm := r.BodyMode()
	st := relayState{upKeep: !r.Close && r.Minor == 1, keep: c.keepClient(svc) && bm != httpparse.BodyClose}
	var flags respFlags
	if bm == httpparse.BodyChunked {
		if c.head.Minor == 1 {
			flags |= respChunked
		} else {
			st.keep = false // HTTP/1.0 client: decoded body, close-delimited
		}
	}
	if c.buf.r != c.buf.w && !st.keep {
		c.linger = true
	}
	if !st.keep {
		flags |= respClose
	}
	b := appendResponseHead(c.getWB(), r, c.extraHeaders(cfg), flags)
	c.res.Status = r.Status

	var err error
	switch bm {
	case httpparse.BodyNone:
		// The upstream exchange is over: pool it before the client can
		// send its next request.
		st.released = c.releaseUpstream(cfg, u, st.upKeep)
		err = c.writeClient(b, idle)
	case httpparse.BodyLength:
		err = c.relayLengthBody(cfg, u, b, idle, &st)
	case httpparse.BodyChunked:
		if err = c.writeClient(b, idle); err == nil {
			c.chunk.Reset(httpparse.Limits{})
			_, n, srcErr, dstErr := c.relayChunked(&u.buf, 0, u.nc, u.fill, c.nc, flags&respChunked != 0, idle, 0)
			c.res.BytesOut += n
			err = c.relayEnd(srcErr, dstErr, "relay chunked response body", &st)
		}
	case httpparse.BodyClose:
		st.upKeep = false
		err = c.relayCloseBody(u, b, idle)
	}
	if c.watchStop() {
		// The client reset (or fully closed) before the response was
		// completely written; a failed relay is not the upstream's.
		c.res.UpstreamErr = nil
		err = errClientGone
	}
	if err != nil {
		c.res.ClientAborted = true
		st.upKeep, st.keep = false, false
	}
	if !st.released {
		c.releaseUpstream(cfg, u, st.upKeep)
	}
	return st.keep
}

// relayEnd sorts out a body relay's errors: a client write error is
// returned; an upstream read error is recorded and ends both connections.
func (c *conn) relayEnd(srcErr, dstErr error, what string, st *relayState) error {
	if dstErr != nil {
		return dstErr
	}
	if srcErr != nil {
		c.res.UpstreamErr = fmt.Errorf("%s: %w", what, srcErr)
		st.upKeep, st.keep = false, false
	}
	return nil
}

// relayLengthBody writes head b with as much of a Content-Length body as
// is buffered, then copies the rest. A body that is complete in the buffer
// releases u before the client write.
func (c *conn) relayLengthBody(cfg *Config, u *upConn, b []byte, idle time.Duration, st *relayState) error {
	left := u.resp.ContentLength
	k := min(int64(u.buf.w-u.buf.r), left, int64(cap(b)-len(b)))
	b = append(b, u.buf.b[u.buf.r:u.buf.r+int(k)]...)
	u.buf.r += int(k)
	left -= k
	if left == 0 {
		st.released = c.releaseUpstream(cfg, u, st.upKeep)
		return c.writeClient(b, idle)
	}
	if err := c.writeClient(b, idle); err != nil {
		return err
	}
	if k = min(int64(u.buf.w-u.buf.r), left); k > 0 {
		if err := c.writeClient(u.buf.b[u.buf.r:u.buf.r+int(k)], idle); err != nil {
			return err
		}
		u.buf.r += int(k)
		left -= k
	}
	if left == 0 {
		return nil
	}
	n, srcErr, dstErr := c.copyN(c.nc, u.nc, left, idle, false)
	c.res.BytesOut += n
	return c.relayEnd(srcErr, dstErr, "relay response body", st)
}

// relayCloseBody writes head b, the buffered body bytes, then copies until
// the upstream closes (a close-delimited body; its EOF is no error).
func (c *conn) relayCloseBody(u *upConn, b []byte, idle time.Duration) error {
	if err := c.writeClient(b, idle); err != nil {
		return err
	}
	if u.buf.w > u.buf.r {
		if err := c.writeClient(u.buf.b[u.buf.r:u.buf.w], idle); err != nil {
			return err
		}
		u.buf.r = u.buf.w
	}
	n, srcErr, dstErr := c.copyN(c.nc, u.nc, unboundedBody, idle, false)
	c.res.BytesOut += n
	if dstErr != nil {
		return dstErr
	}
	if srcErr != nil && srcErr != io.ErrUnexpectedEOF {
		c.res.UpstreamErr = fmt.Errorf("relay response body: %w", srcErr)
	}
	return nil
}
