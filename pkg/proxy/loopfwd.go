package proxy

import (
	"errors"
	"fmt"
	"io"

	"github.com/rl-tproxy/rl-tproxy/pkg/httpparse"
)

// Response phases of an exchange.
const (
	rpHead    uint8 = iota // waiting for the (final) response head
	rpLength               // relaying a Content-Length body
	rpChunked              // relaying a chunked body
	rpClose                // relaying a close-delimited body
)

// forward sends the admitted request upstream: first an upstream
// connection (pooled, or connecting), then upReady.
func (c *clientConn) forward() {
	r := c.r
	h := &r.head
	r.canRetry = r.bodyDone && h.BodyMode() != httpparse.BodyChunked && idempotent(h.Method)
	r.res.Upstream, r.upStart = r.svc.Upstream, c.ls.now(r.cfg)
	c.state = lcUpstream
	c.setDeadline(c.ls.l.Now() + int64(r.svc.UpstreamTimeoutOrDefault()))
	c.getUpstream(false)
}

// upReady sends the request on u, which is connected.
func (c *clientConn) upReady(u *upstreamConn) {
	r := c.r
	h := &r.head
	r.up, u.c = u, c
	if h.Expect100 && !r.bodyDone && !r.sent100 {
		c.s.Write(continue100)
		r.sent100 = true
	}
	b := appendRequestHead(c.ls.scratch[:0], h, r.svc, r.req.Remote, r.dec.Forward)
	var body []byte
	switch h.BodyMode() {
	case httpparse.BodyLength:
		r.bodyLeft = h.ContentLength
		if k := min(int64(c.buf.w-c.buf.r), r.bodyLeft); k > 0 {
			body = c.buf.b[c.buf.r : c.buf.r+int(k)]
			c.buf.r += int(k)
			r.bodyLeft -= k
			r.res.BytesIn += k
		}
		r.bodyDone = r.bodyLeft == 0
	case httpparse.BodyChunked:
		r.chunk.Reset(r.svc.Limits)
	}
	r.rp, r.upBytes = rpHead, false
	c.ls.write2(u.s, b, body)
	c.state = lcExchange
	if r.bodyDone {
		c.setDeadline(c.ls.l.Now() + int64(r.svc.UpstreamTimeoutOrDefault()))
		c.flow() // a client paused while its body filled the buffer reads again
		return
	}
	c.setDeadline(c.ls.l.Now() + int64(r.svc.IdleTimeoutOrDefault()))
	c.resume()
	if h.BodyMode() == httpparse.BodyChunked {
		c.pumpChunked()
	} else {
		c.maybeSpliceBody(u)
	}
}

// clientData handles client bytes during the exchange: body bytes go
// upstream, later ones wait in the buffer (pipelining).
func (c *clientConn) clientData(b []byte) {
	r := c.r
	if r.bodyDone {
		c.bufferIn(b)
		return
	}
	if r.head.BodyMode() == httpparse.BodyChunked {
		for len(b) > 0 && c.state == lcExchange && !r.bodyDone {
			if c.buf.b == nil {
				c.buf.get(c.ls, bufSize)
			}
			k := min(len(b), c.buf.room())
			if k == 0 {
				c.requestFail(httpparse.ErrHeaderTooBig)
				return
			}
			c.buf.add(b[:k])
			b = b[k:]
			c.pumpChunked()
		}
		if len(b) > 0 && c.state == lcExchange {
			c.bufferIn(b)
		}
		return
	}
	k := min(int64(len(b)), r.bodyLeft)
	u := r.up
	u.s.Write(b[:k])
	r.bodyLeft -= k
	r.res.BytesIn += k
	if r.bodyLeft == 0 {
		r.bodyDone = true
		c.bodySent()
	} else {
		c.setDeadline(c.ls.l.Now() + int64(r.svc.IdleTimeoutOrDefault()))
		c.maybeSpliceBody(u)
	}
	if rest := b[k:]; len(rest) > 0 {
		c.bufferIn(rest)
	}
	if u.s.Pending() > loopMaxPending {
		c.pause() // resumed by the upstream's OnDrained
	}
}

// bodySent: the whole request is upstream; the response head is due
// within the upstream timeout.
func (c *clientConn) bodySent() {
	if c.r.rp == rpHead {
		c.setDeadline(c.ls.l.Now() + int64(c.r.svc.UpstreamTimeoutOrDefault()))
	}
}

// pumpChunked decodes the buffered chunked body and sends it upstream
// re-encoded (extensions and trailers dropped).
func (c *clientConn) pumpChunked() {
	r := c.r
	u := r.up
	o := c.ls.scratch[:0]
	for !r.bodyDone {
		n, data, err := r.chunk.Decode(c.buf.unread())
		c.buf.r += n
		switch {
		case err == nil && len(data) > 0:
			r.bodyIn += int64(len(data))
			r.res.BytesIn += int64(len(data))
			if m := r.svc.MaxBodyBytes; m > 0 && r.bodyIn > m {
				c.requestFail(errBodyTooLarge)
				return
			}
			if cap(o)-len(o) < len(data)+32 {
				c.ls.write2(u.s, o, nil)
				o = o[:0]
			}
			o = httpparse.AppendChunkHeader(o, len(data))
			if cap(o)-len(o) < len(data)+2 {
				c.ls.write2(u.s, o, data)
				o = append(o[:0], '\r', '\n')
				continue
			}
			o = append(o, data...)
			o = append(o, '\r', '\n')
		case err == nil:
			o = append(o, httpparse.LastChunk...)
			r.bodyDone = true
		case err == httpparse.ErrNeedMore:
			if len(o) > 0 {
				c.ls.write2(u.s, o, nil)
			}
			c.setDeadline(c.ls.l.Now() + int64(r.svc.IdleTimeoutOrDefault()))
			if u.s.Pending() > loopMaxPending {
				c.pause()
			}
			return
		default:
			c.requestFail(err)
			return
		}
	}
	c.ls.write2(u.s, o, nil)
	c.bodySent()
}

// requestFail ends an exchange whose request body broke a rule after
// admission: 413 or the chunked parser's status, unless the upstream's
// response head already reached the client. Then an answer of the
// proxy's own would land inside the relayed body: the upstream is
// dropped, the client closed (its response ends short), and the result
// keeps the relayed status with the cause in UpstreamErr.
func (c *clientConn) requestFail(err error) {
	r := c.r
	r.upDrop()
	rule, status := rejectStatus(err)
	if r.res.Status == 0 {
		c.rejectRule(r.cfg, r.svc, rule, status)
		return
	}
	r.cfg.Log().Debug("request body broke a rule after the response head", "service", r.svc.Name, "rule", rule, "remote", c.remote)
	r.cfg.ReportReject(r.svc, c.remote, rule, 0)
	r.res.UpstreamErr = fmt.Errorf("exchange cut after the response head: request body (%s): %w", rule, err)
	c.linger = true
	c.complete(false)
}

// rejectStatus is the rule a request body error broke and its status
// (as reject answers it).
func rejectStatus(err error) (string, int) {
	if err == errBodyTooLarge {
		return "body-too-large", 413
	}
	var pe *httpparse.Error
	if errors.As(err, &pe) {
		return pe.Rule, pe.Status
	}
	return "malformed", 400
}

// exchangeTimeout: no progress within the exchange's deadline.
func (c *clientConn) exchangeTimeout() {
	r := c.r
	if c.spliceProgress() {
		return
	}
	switch {
	case !r.bodyDone:
		r.upDrop()
		c.abort() // the client stopped sending its body
	case r.rp == rpHead:
		r.upDrop()
		c.upstreamFail(fmt.Errorf("read response head: %w", errLoopTimeout))
	default:
		r.res.UpstreamErr = fmt.Errorf("relay response body: %w", errLoopTimeout)
		r.upDrop()
		c.linger = true
		c.complete(false)
	}
}

// toClient writes response bytes to the client; above the bound the
// upstream stops being read until the client drained.
func (c *clientConn) toClient(a, b []byte) {
	r := c.r
	c.ls.write2(c.s, a, b)
	r.res.BytesOut += int64(len(a) + len(b))
	c.upBackpressure()
}

// upBackpressure pauses reading the upstream while more than
// loopMaxPending bytes wait to be written to the client; its OnDrained
// resumes it.
func (c *clientConn) upBackpressure() {
	if u := c.r.up; u != nil && !u.paused && c.s.Pending() > loopMaxPending {
		u.paused = true
		u.s.PauseRead()
	}
}

// upData handles response bytes from u.
func (c *clientConn) upData(u *upstreamConn, b []byte) {
	r := c.r
	r.upBytes = true
	src := b
	held := !u.buf.empty()
	if held {
		// What is held (a partial head, chunk line or trailer) is bounded by
		// the parsers' limits, checked below; the read comes on top.
		u.buf.addGrow(b)
		src = u.buf.unread()
	}
	n, alive := c.consumeResponse(u, src)
	if !alive {
		return
	}
	if r.rp != rpHead {
		// The body relays under the idle timeout, renewed by each read;
		// the response head (interim responses included) keeps the
		// deadline the upstream timeout set when the request was sent,
		// so an upstream dribbling its head cannot stretch it.
		c.setDeadline(c.ls.l.Now() + int64(r.svc.IdleTimeoutOrDefault()))
	}
	if held {
		u.buf.r += n
		if u.buf.empty() {
			u.buf.put(c.ls)
		}
	} else if n < len(src) {
		u.buf.get(c.ls, bufSize)
		u.buf.add(src[n:])
	}
	if u.buf.empty() {
		c.maybeSplice(u)
	}
}

var errHeadTooLarge = errors.New("response head too large")

// consumeResponse relays what src holds of the response; it returns the
// bytes consumed and whether u still serves this exchange (false: it was
// released or closed, and c moved on).
func (c *clientConn) consumeResponse(u *upstreamConn, src []byte) (int, bool) {
	r := c.r
	n := 0
	for {
		switch r.rp {
		case rpHead:
			resp := &u.resp
			err := resp.ParseUpstream(src[n:], r.head.Method, &r.interims)
			if err == httpparse.ErrNeedMore {
				if len(src)-n >= bufSize {
					c.upFail(u, fmt.Errorf("read response head: %w", errHeadTooLarge))
					return 0, false
				}
				return n, true
			}
			if err != nil {
				c.upFail(u, fmt.Errorf("parse response head: %w", err))
				return 0, false
			}
			n += resp.HeadLen
			if resp.Interim() {
				c.relayInterim(resp)
				continue
			}
			r.res.UpstreamStatus, r.res.UpstreamTTFB = resp.Status, c.ls.now(r.cfg).Sub(r.upStart)
			if resp.Status == 101 {
				c.upgrade(u, src[n:])
				return 0, false
			}
			k, alive := c.responseHead(u, src[n:])
			n += k
			if !alive {
				return n, false
			}
		case rpLength:
			k := int(min(int64(len(src)-n), r.respLeft))
			c.toClient(src[n:n+k], nil)
			n += k
			r.respLeft -= int64(k)
			if r.respLeft == 0 {
				c.endResponse(u, n < len(src))
				return n, false
			}
			return n, true
		case rpChunked:
			k, done, err := c.relayChunks(src[n:])
			n += k
			if err != nil {
				r.res.UpstreamErr = fmt.Errorf("relay chunked response body: %w", err)
				r.upDrop()
				c.linger = true
				c.complete(false)
				return 0, false
			}
			if done {
				c.endResponse(u, n < len(src))
				return n, false
			}
			return n, true
		case rpClose:
			c.toClient(src[n:], nil)
			return len(src), true
		}
	}
}

// relayInterim passes a 1xx response on to an HTTP/1.1 client, except a
// second 100 after the proxy's own.
func (c *clientConn) relayInterim(resp *httpparse.Response) {
	r := c.r
	if r.head.Minor != 1 || resp.Status == 100 && r.sent100 {
		return
	}
	c.toClient(appendResponseHead(c.ls.scratch[:0], resp, nil, 0), nil)
}

// extraHeaders are the Decision's fields added to an upstream response.
func (r *reqState) extraHeaders() []httpparse.Header {
	if r.hook == nil {
		return nil
	}
	return r.dec.Header
}

// responseHead writes the final response head with the body bytes that
// follow it in rest, and sets the body phase.
func (c *clientConn) responseHead(u *upstreamConn, rest []byte) (int, bool) {
	r := c.r
	resp := &u.resp
	bm := resp.BodyMode()
	r.upKeep = resp.Reusable(r.head.Method)
	keep := c.keepClient() && bm != httpparse.BodyClose
	if tunnelAnswer(r.head.Method, resp.Status) {
		// Never reached while CONNECT is refused (startRequest); if it
		// were, the connection after this head is a tunnel: reusing it
		// would send the next request into it.
		r.upKeep, keep = false, false
	}
	var flags respFlags
	if bm == httpparse.BodyChunked {
		if r.head.Minor == 1 {
			flags |= respChunked
			r.chunkedRs = true
		} else {
			keep = false // HTTP/1.0 client: decoded body, close-delimited
		}
	}
	if !keep {
		flags |= respClose
	}
	r.keep = keep
	hd := appendResponseHead(c.ls.scratch[:0], resp, r.extraHeaders(), flags)
	r.res.Status = resp.Status
	switch bm {
	case httpparse.BodyNone:
		c.toClient(hd, nil)
		c.endResponse(u, len(rest) > 0)
		return 0, false
	case httpparse.BodyLength:
		k := min(int64(len(rest)), resp.ContentLength)
		c.toClient(hd, rest[:k])
		r.respLeft = resp.ContentLength - k
		if r.respLeft == 0 {
			c.endResponse(u, int(k) < len(rest))
			return int(k), false
		}
		r.rp = rpLength
		return int(k), true
	case httpparse.BodyChunked:
		c.toClient(hd, nil)
		r.rchunk.Reset(httpparse.Limits{})
		r.rp = rpChunked
		return 0, true
	}
	r.upKeep = false
	r.rp = rpClose
	c.toClient(hd, rest)
	return len(rest), true
}

// tunnelAnswer reports whether a response with status to method leaves
// its connection a tunnel (a 2xx to CONNECT, or a 101): never reusable.
func tunnelAnswer(method []byte, status int) bool {
	return status == 101 || status >= 200 && status < 300 && httpparse.EqualFold(method, "CONNECT")
}

// relayChunks decodes chunked response bytes from src and writes them to
// the client, re-encoded when the client speaks HTTP/1.1. It returns the
// bytes consumed and whether the body ended.
func (c *clientConn) relayChunks(src []byte) (int, bool, error) {
	r := c.r
	o := c.ls.scratch[:0]
	n := 0
	defer func() {
		if len(o) > 0 {
			c.toClient(o, nil)
		}
	}()
	for {
		k, data, err := r.rchunk.Decode(src[n:])
		n += k
		switch {
		case err == nil && len(data) > 0:
			if !r.chunkedRs {
				if len(o) > 0 {
					c.toClient(o, nil)
					o = o[:0]
				}
				c.toClient(data, nil)
				continue
			}
			if cap(o)-len(o) < len(data)+32 {
				c.toClient(o, nil)
				o = o[:0]
			}
			o = httpparse.AppendChunkHeader(o, len(data))
			if cap(o)-len(o) < len(data)+2 {
				c.toClient(o, data)
				o = append(o[:0], '\r', '\n')
				continue
			}
			o = append(o, data...)
			o = append(o, '\r', '\n')
		case err == nil:
			if r.chunkedRs {
				o = append(o, httpparse.LastChunk...)
			}
			return n, true, nil
		case err == httpparse.ErrNeedMore:
			return n, false, nil
		default:
			return n, false, err
		}
	}
}

// endResponse: the response was relayed completely; stray says bytes
// followed it (they poison u). u goes back to its pool or is closed.
func (c *clientConn) endResponse(u *upstreamConn, stray bool) {
	r := c.r
	r.up, u.c = nil, nil
	if !stray {
		// Every caller passes stray = "src had bytes past the response";
		// without them, what u.buf held (src, when part of the response
		// had been held back) is consumed: it must not count as unread.
		u.buf.r = u.buf.w
	}
	c.releaseUp(u, r.upKeep && !stray && r.bodyDone, stray)
	keep := r.keep && r.bodyDone
	if !r.bodyDone {
		c.linger = true
	}
	c.complete(keep)
}

// upEOF: u ended (EOF, or an error when err is not nil) during the
// exchange.
func (c *clientConn) upEOF(u *upstreamConn, err error) {
	r := c.r
	if err == nil {
		err = io.ErrUnexpectedEOF
	}
	if c.state == lcUpgrading {
		r.res.UpstreamErr = fmt.Errorf("upgraded upstream: %w", err)
		c.close() // drops u (r.up)
		return
	}
	switch r.rp {
	case rpHead:
		if r.canRetry && u.reused && !r.retried && !r.upBytes {
			// A pooled connection that failed before any response
			// byte: replay once on a fresh one.
			r.retried = true
			r.upDrop()
			c.state = lcUpstream
			c.getUpstream(true)
			return
		}
		c.upFail(u, fmt.Errorf("read response head: %w", err))
	case rpClose:
		r.upDrop()
		c.complete(false)
	default:
		r.res.UpstreamErr = fmt.Errorf("relay response body: %w", err)
		r.upDrop()
		c.linger = true
		c.complete(false)
	}
}

// upFail closes u and answers the upstream failure.
func (c *clientConn) upFail(u *upstreamConn, err error) {
	c.r.upDrop()
	c.upstreamFail(err)
}

// upDrop closes the exchange's upstream connection (never pooled).
func (r *reqState) upDrop() {
	if u := r.up; u != nil {
		r.up = nil
		u.c = nil
		u.close()
	}
}

func errUpstreamTimeout(addr string) error {
	return fmt.Errorf("dial upstream %s: %w", addr, errLoopTimeout)
}
