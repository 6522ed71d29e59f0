package proxy

import (
	"errors"
	"fmt"
	"io"
	"net"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/rl-tproxy/rl-tproxy/pkg/httpparse"
)

// errRetry marks an exchange on a reused pooled connection that failed
// before anything was sent or received, so it can be replayed once.
var errRetry = errors.New("proxy: pooled upstream connection broken")

var continue100 = []byte("HTTP/1.1 100 Continue\r\n\r\n")

// errClientGone: the abort watcher saw the client go away.
var errClientGone = errors.New("proxy: client went away")

// errBodyTooLarge: a chunked request body exceeded Service.MaxBodyBytes.
var errBodyTooLarge = errors.New("proxy: request body too large")

func idempotent(m []byte) bool {
	switch string(m) {
	case "GET", "HEAD", "OPTIONS", "TRACE", "PUT", "DELETE":
		return true
	}
	return false
}

// forward sends the admitted request upstream and relays the response. base
// is the buffer offset where the head ends (the head stays valid until the
// request is done). It reports whether the client connection stays open.
func (c *conn) forward(cfg *Config, svc *Service, base int) bool {
	h := &c.head
	mode := h.BodyMode()
	bodyless := mode == httpparse.BodyNone || mode == httpparse.BodyLength && h.ContentLength == 0
	canRetry := bodyless && idempotent(h.Method)
	fresh := false
	c.res.Upstream, c.res.upStart = svc.Upstream, cfg.now()
	for {
		u, err := c.getUpstream(cfg, svc, fresh)
		if err != nil {
			return c.upstreamFail(cfg, svc, err)
		}
		if h.Expect100 && !bodyless && !c.sent100 {
			c.nc.SetWriteDeadline(time.Now().Add(svc.idleTimeout()))
			if _, err := c.w.writeAll(c.nc, c.raw, continue100); err != nil {
				u.close()
				c.res.ClientAborted = true
				return false
			}
			c.sent100 = true
		}
		keep, err := c.exchange(cfg, svc, u, base, canRetry && u.reused && !fresh)
		if err == errRetry {
			u.close()
			fresh = true
			continue
		}
		return keep
	}
}

func (c *conn) getUpstream(cfg *Config, svc *Service, fresh bool) (*upConn, error) {
	return c.p.pools.get(cfg, svc.Upstream, svc.upstreamTimeout(), fresh)
}

// upstreamFail answers 502 (504 on a timeout) when nothing was sent to the
// client yet, and closes the client connection.
func (c *conn) upstreamFail(cfg *Config, svc *Service, err error) bool {
	c.res.UpstreamErr = err
	status := 502
	if isTimeout(err) {
		status = 504
	}
	cfg.logger().Debug("upstream failed", "service", svc.Name, "upstream", svc.Upstream, "err", err)
	if c.res.Status == 0 {
		c.answer(status, "Connection: close\r\n")
	}
	c.linger = true
	return false
}

// exchange runs one request/response on u. It consumes u (pooled again or
// closed) except when it returns errRetry (the caller closes u).
func (c *conn) exchange(cfg *Config, svc *Service, u *upConn, base int, retryable bool) (bool, error) {
	h := &c.head
	mode := h.BodyMode()
	ut := svc.upstreamTimeout()
	idle := svc.idleTimeout()

	// Head, plus the body when it is already buffered and small.
	b := c.getWB()
	b = appendRequestHead(b, h, svc, c.remote, c.dec.Forward)
	bodyLeft := int64(0)
	if mode == httpparse.BodyLength {
		bodyLeft = h.ContentLength
		if avail := int64(c.buf.w - c.buf.r); avail > 0 && bodyLeft > 0 {
			k := min(avail, bodyLeft, int64(cap(b)-len(b)))
			b = append(b, c.buf.b[c.buf.r:c.buf.r+int(k)]...)
			c.buf.r += int(k)
			bodyLeft -= k
			c.res.BytesIn += k
		}
	}
	u.nc.SetDeadline(time.Now().Add(ut))
	if _, err := c.w.writeAll(u.nc, u.raw, b); err != nil {
		if retryable {
			return false, errRetry
		}
		u.close()
		return c.upstreamFail(cfg, svc, fmt.Errorf("send request head: %w", err)), nil
	}

	// Request body.
	switch mode {
	case httpparse.BodyLength:
		if avail := int64(c.buf.w - c.buf.r); avail > 0 && bodyLeft > 0 {
			k := min(avail, bodyLeft)
			if _, err := c.w.writeAll(u.nc, u.raw, c.buf.b[c.buf.r:c.buf.r+int(k)]); err != nil {
				u.close()
				return c.upstreamFail(cfg, svc, fmt.Errorf("send request body: %w", err)), nil
			}
			c.buf.r += int(k)
			bodyLeft -= k
			c.res.BytesIn += k
		}
		if bodyLeft > 0 {
			n, srcErr, dstErr := c.copyN(u.nc, c.nc, bodyLeft, idle, true)
			c.res.BytesIn += n
			if srcErr != nil {
				u.close()
				c.res.ClientAborted = true
				return false, nil
			}
			if dstErr != nil {
				u.close()
				return c.upstreamFail(cfg, svc, fmt.Errorf("send request body: %w", dstErr)), nil
			}
		}
	case httpparse.BodyChunked:
		c.chunk.Reset(svc.Limits)
		need := headNeed(svc.Limits)
		in, _, srcErr, dstErr := c.relayChunked(&c.buf, base, c.nc, func() (int, error) { return c.fill(need) },
			u.nc, true, idle, svc.MaxBodyBytes)
		c.res.BytesIn += in
		if srcErr != nil {
			u.close()
			if srcErr == errBodyTooLarge {
				return c.rejectRule(cfg, svc, "body-too-large", 413), nil
			}
			var pe *httpparse.Error
			if errors.As(srcErr, &pe) {
				return c.reject(cfg, svc, srcErr), nil
			}
			c.res.ClientAborted = true
			return false, nil
		}
		if dstErr != nil {
			u.close()
			return c.upstreamFail(cfg, svc, fmt.Errorf("send chunked body: %w", dstErr)), nil
		}
	}

	// From here on the client is not read until the response is written:
	// the abort watcher cancels the exchange when the client goes away.
	c.watchResponsePhase(cfg)
	if c.attachUp(u) {
		u.close()
		c.res.ClientAborted = true
		return false, nil
	}

	// Response head (1xx interim responses are relayed or dropped).
	u.buf.get(bufSize)
	lim := httpparse.Limits{}
	r := &u.resp
	if mode != httpparse.BodyNone {
		// The deadline set before the head covers the response of a
		// bodyless request; after a body, the wait starts again.
		u.nc.SetReadDeadline(time.Now().Add(ut))
	}
	for {
		err := r.Parse(u.buf.unread(), lim, h.Method)
		if err == httpparse.ErrNeedMore {
			if u.buf.w == len(u.buf.b) {
				if u.buf.r == 0 {
					u.close()
					return c.upstreamFail(cfg, svc, errors.New("response head too large")), nil
				}
				u.buf.compact()
			}
			if _, err := u.fill(); err != nil {
				if c.detachUp() {
					u.close()
					c.res.ClientAborted = true
					return false, nil
				}
				if retryable && u.buf.w == 0 && !isTimeout(err) {
					return false, errRetry
				}
				u.close()
				return c.upstreamFail(cfg, svc, fmt.Errorf("read response head: %w", err)), nil
			}
			continue
		}
		if err != nil {
			u.close()
			return c.upstreamFail(cfg, svc, fmt.Errorf("parse response head: %w", err)), nil
		}
		if r.Status == 101 || !r.Informational() {
			break
		}
		// 1xx: pass it on (HTTP/1.1 clients; not a second 100 after ours).
		if h.Minor == 1 && !(r.Status == 100 && c.sent100) {
			b = appendResponseHead(c.getWB(), r, nil, false, false, false)
			c.nc.SetWriteDeadline(time.Now().Add(idle))
			if _, err := c.w.writeAll(c.nc, c.raw, b); err != nil {
				u.close()
				c.res.ClientAborted = true
				return false, nil
			}
		}
		u.buf.r += r.HeadLen
		if u.buf.r == u.buf.w {
			u.buf.r, u.buf.w = 0, 0
		}
	}
	u.buf.r += r.HeadLen
	c.res.UpstreamStatus, c.res.UpstreamTTFB = r.Status, cfg.now().Sub(c.res.upStart)

	if r.Status == 101 {
		if !h.Upgrade || !r.Upgrade {
			u.close()
			return c.upstreamFail(cfg, svc, errors.New("101 Switching Protocols without an upgrade request")), nil
		}
		var extra []httpparse.Header
		if cfg.Hook != nil {
			extra = c.dec.Header
		}
		c.res.Status = 101
		if c.watchStop() { // the tunnel reads the client
			u.close()
			c.res.ClientAborted = true
			return false, nil
		}
		if err := c.writeClient(appendResponseHead(c.getWB(), r, extra, false, true, false), idle); err != nil {
			u.close()
			c.res.ClientAborted = true
			return false, nil
		}
		c.tunnel(u, idle)
		return false, nil
	}

	// Response head and body to the client.
	bm := r.BodyMode()
	keep := c.keepClient(svc) && bm != httpparse.BodyClose
	chunkedOut := bm == httpparse.BodyChunked && h.Minor == 1
	if bm == httpparse.BodyChunked && !chunkedOut {
		keep = false // HTTP/1.0 client: decoded body, close-delimited
	}
	if c.buf.r != c.buf.w && !keep {
		c.linger = true
	}
	var extra []httpparse.Header
	if cfg.Hook != nil {
		extra = c.dec.Header
	}
	b = appendResponseHead(c.getWB(), r, extra, chunkedOut, false, !keep)
	c.res.Status = r.Status
	upKeep := !r.Close && r.Minor == 1

	var err error
	released := false
	switch bm {
	case httpparse.BodyNone:
		// The upstream exchange is over: pool it before the client can
		// send its next request.
		released = c.releaseUpstream(cfg, u, upKeep)
		err = c.writeClient(b, idle)
	case httpparse.BodyLength:
		left := r.ContentLength
		k := min(int64(u.buf.w-u.buf.r), left, int64(cap(b)-len(b)))
		b = append(b, u.buf.b[u.buf.r:u.buf.r+int(k)]...)
		u.buf.r += int(k)
		left -= k
		if left == 0 {
			released = c.releaseUpstream(cfg, u, upKeep)
			err = c.writeClient(b, idle)
			break
		}
		if err = c.writeClient(b, idle); err != nil {
			break
		}
		if k = min(int64(u.buf.w-u.buf.r), left); k > 0 {
			if err = c.writeClient(u.buf.b[u.buf.r:u.buf.r+int(k)], idle); err != nil {
				break
			}
			u.buf.r += int(k)
			left -= k
		}
		if left > 0 {
			n, srcErr, dstErr := c.copyN(c.nc, u.nc, left, idle, false)
			c.res.BytesOut += n
			if dstErr != nil {
				err = dstErr
			} else if srcErr != nil {
				c.res.UpstreamErr = fmt.Errorf("relay response body: %w", srcErr)
				upKeep, keep = false, false
			}
		}
	case httpparse.BodyChunked:
		if err = c.writeClient(b, idle); err != nil {
			break
		}
		c.chunk.Reset(lim)
		_, n, srcErr, dstErr := c.relayChunked(&u.buf, 0, u.nc, u.fill, c.nc, chunkedOut, idle, 0)
		c.res.BytesOut += n
		if dstErr != nil {
			err = dstErr
		} else if srcErr != nil {
			c.res.UpstreamErr = fmt.Errorf("relay chunked response body: %w", srcErr)
			upKeep, keep = false, false
		}
	case httpparse.BodyClose:
		upKeep = false
		if err = c.writeClient(b, idle); err != nil {
			break
		}
		if k := u.buf.w - u.buf.r; k > 0 {
			if err = c.writeClient(u.buf.b[u.buf.r:u.buf.w], idle); err != nil {
				break
			}
			u.buf.r = u.buf.w
		}
		n, srcErr, dstErr := c.copyN(c.nc, u.nc, 1<<62, idle, false)
		c.res.BytesOut += n
		if dstErr != nil {
			err = dstErr
		} else if srcErr != nil && srcErr != io.ErrUnexpectedEOF {
			c.res.UpstreamErr = fmt.Errorf("relay response body: %w", srcErr)
		}
	}
	if c.watchStop() {
		// The client reset (or fully closed) before the response was
		// completely written; a failed relay is not the upstream's.
		c.res.UpstreamErr = nil
		err = errClientGone
	}
	if err != nil {
		c.res.ClientAborted = true
		upKeep = false
		keep = false
	}
	if !released {
		c.releaseUpstream(cfg, u, upKeep)
	}
	return keep, nil
}

// releaseUpstream pools u when its exchange ended cleanly, else closes it.
func (c *conn) releaseUpstream(cfg *Config, u *upConn, keep bool) bool {
	if c.detachUp() {
		keep = false // the watcher may have closed it
	}
	if keep {
		c.p.pools.put(cfg, u)
	} else {
		u.close()
	}
	return true
}

// writeClient writes b to the client with a write deadline.
func (c *conn) writeClient(b []byte, timeout time.Duration) error {
	n, err := c.w.writeTimeout(c.nc, c.raw, b, timeout)
	c.res.BytesOut += int64(n)
	return err
}

// spliceMin is the body size from which kernel splice is worth its setup.
const spliceMin = 64 << 10

// copyN copies n bytes from src to dst with a progress timeout, reporting
// which side failed (a short source is io.ErrUnexpectedEOF on srcErr).
func (c *conn) copyN(dst, src net.Conn, n int64, timeout time.Duration, clientSrc bool) (written int64, srcErr, dstErr error) {
	for written < n {
		step := min(n-written, 1<<20)
		dl := time.Now().Add(timeout)
		src.SetReadDeadline(dl)
		dst.SetWriteDeadline(dl)
		if dt, ok := dst.(*net.TCPConn); ok && step >= spliceMin {
			if _, ok := src.(*net.TCPConn); ok {
				c.lr = io.LimitedReader{R: src, N: step}
				m, err := dt.ReadFrom(&c.lr)
				c.lr.R = nil
				written += m
				if err == nil && m < step {
					return written, io.ErrUnexpectedEOF, nil
				}
				if err != nil {
					client := dst
					if clientSrc {
						client = src
					}
					if peerGone(client) == clientSrc {
						return written, err, nil
					}
					return written, nil, err
				}
				continue
			}
		}
		buf := c.scratch()
		k := min(int64(len(buf)), step)
		m, rerr := src.Read(buf[:k])
		if m > 0 {
			w, werr := dst.Write(buf[:m])
			written += int64(w)
			if werr != nil {
				return written, nil, werr
			}
		}
		if rerr != nil {
			if rerr == io.EOF {
				rerr = io.ErrUnexpectedEOF
			}
			return written, rerr, nil
		}
	}
	return written, nil, nil
}

// peerGone reports whether the peer of nc closed or reset the connection.
func peerGone(nc net.Conn) bool {
	sc, ok := nc.(syscall.Conn)
	if !ok {
		return false
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return true
	}
	gone := false
	var b [1]byte
	if err := raw.Control(func(fd uintptr) {
		n, err := recvPeek(fd, b[:])
		gone = err != nil && err != unix.EAGAIN || err == nil && n == 0
	}); err != nil {
		return true
	}
	return gone
}

// relayChunked decodes a chunked body from src (bytes already buffered in
// sb; compaction keeps sb.b[:base]) and writes it to dst, re-encoded as
// chunked when chunkedOut (trailers are dropped) or as raw bytes otherwise.
// A body longer than limit (> 0) fails with errBodyTooLarge.
func (c *conn) relayChunked(sb *buffer, base int, src net.Conn, fill func() (int, error), dst net.Conn, chunkedOut bool, timeout time.Duration, limit int64) (in, out int64, srcErr, dstErr error) {
	dec := &c.chunk
	o := c.getWB()
	flush := func() error {
		if len(o) == 0 {
			return nil
		}
		dst.SetWriteDeadline(time.Now().Add(timeout))
		n, err := dst.Write(o)
		out += int64(n)
		o = o[:0]
		return err
	}
	for {
		n, data, err := dec.Decode(sb.b[sb.r:sb.w])
		sb.r += n
		switch {
		case err == nil && len(data) > 0:
			in += int64(len(data))
			if limit > 0 && in > limit {
				return in, out, errBodyTooLarge, nil
			}
			if cap(o)-len(o) < 32 {
				if err := flush(); err != nil {
					return in, out, nil, err
				}
			}
			if chunkedOut {
				o = httpparse.AppendChunkHeader(o, len(data))
			}
			for len(data) > 0 {
				if len(o) == cap(o) {
					if err := flush(); err != nil {
						return in, out, nil, err
					}
				}
				k := min(cap(o)-len(o), len(data))
				o = append(o, data[:k]...)
				data = data[k:]
			}
			if chunkedOut {
				if cap(o)-len(o) < 2 {
					if err := flush(); err != nil {
						return in, out, nil, err
					}
				}
				o = append(o, '\r', '\n')
			}
		case err == nil:
			if chunkedOut {
				if cap(o)-len(o) < len(httpparse.LastChunk) {
					if err := flush(); err != nil {
						return in, out, nil, err
					}
				}
				o = append(o, httpparse.LastChunk...)
			}
			return in, out, nil, flush()
		case err == httpparse.ErrNeedMore:
			if err := flush(); err != nil {
				return in, out, nil, err
			}
			if sb.r == sb.w {
				sb.r, sb.w = base, base
			} else if sb.w == len(sb.b) {
				k := copy(sb.b[base:], sb.b[sb.r:sb.w])
				sb.r, sb.w = base, base+k
				if sb.w == len(sb.b) {
					return in, out, httpparse.ErrHeaderTooBig, nil
				}
			}
			src.SetReadDeadline(time.Now().Add(timeout))
			if _, err := fill(); err != nil {
				if err == io.EOF {
					err = io.ErrUnexpectedEOF
				}
				return in, out, err, nil
			}
		default:
			return in, out, err, nil
		}
	}
}

// tunnel relays bytes both ways after a 101 until both directions end;
// once one direction ends, the other gets a bounded grace period.
func (c *conn) tunnel(u *upConn, idle time.Duration) {
	c.nc.SetDeadline(time.Time{})
	u.nc.SetDeadline(time.Time{})
	if k := u.buf.w - u.buf.r; k > 0 {
		if _, err := c.nc.Write(u.buf.b[u.buf.r:u.buf.w]); err != nil {
			u.close()
			return
		}
		u.buf.r = u.buf.w
	}
	if k := c.buf.w - c.buf.r; k > 0 {
		if _, err := u.nc.Write(c.buf.b[c.buf.r:c.buf.w]); err != nil {
			u.close()
			return
		}
		c.buf.r = c.buf.w
	}
	grace := min(idle, 10*time.Second)
	endOne := func(dst net.Conn) {
		if cw, ok := dst.(interface{ CloseWrite() error }); ok {
			cw.CloseWrite()
		}
		dl := time.Now().Add(grace)
		c.nc.SetReadDeadline(dl)
		u.nc.SetReadDeadline(dl)
	}
	done := make(chan int64, 1)
	go func() {
		n, _ := io.Copy(u.nc, c.nc)
		endOne(u.nc)
		done <- n
	}()
	n, _ := io.Copy(c.nc, u.nc)
	endOne(c.nc)
	c.res.BytesOut += n
	c.res.BytesIn += <-done
	c.res.Status = 101
	u.close()
}
