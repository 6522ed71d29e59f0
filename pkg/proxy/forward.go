package proxy

import (
	"errors"
	"io"
	"net"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/rl-tproxy/rl-tproxy/pkg/httpparse"
	"github.com/rl-tproxy/rl-tproxy/pkg/proxyproto"
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
	if svc.ProxyProtocol != proxyproto.None {
		return c.getPinned(cfg, svc, fresh)
	}
	c.dropPinned() // the service stopped using PROXY headers (Proxy.Update)
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

// releaseUpstream pools u when its exchange ended cleanly, else closes it.
func (c *conn) releaseUpstream(cfg *Config, u *upConn, keep bool) bool {
	if c.detachUp() {
		keep = false // the watcher may have closed it
	}
	if keep && u.pinned {
		c.keepPinned(u)
	} else if keep {
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
		step := min(n-written, copyStep)
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
