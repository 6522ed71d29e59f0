package proxy

import (
	"errors"
	"io"
	"math"

	"github.com/rl-tproxy/rl-tproxy/pkg/evloop"
	"github.com/rl-tproxy/rl-tproxy/pkg/httpparse"
)

// Large bodies go from one socket to the other inside the kernel
// (evloop's Sock.SpliceTo: splice(2) through a pipe), not through the
// loop's buffers: a Content-Length body, request or response, once at
// least Config.SpliceMin bytes of it are left after the bytes that came
// with its head; a close-delimited response body once that many were
// relayed. Chunked bodies are decoded (their framing is checked), so they
// are copied. An exchange has at most one splice at a time (a socket
// takes part in one): a response that comes while the request body is
// still spliced is copied.

// DefaultSpliceMin is Config.SpliceMin's default. Measured with
// test/bench/bigbody.sh (docs/bench/evloop.md, "Splicing large bodies"),
// a splice of 112 KiB took 0.67x the CPU per MiB of the copy, one of
// 80 KiB 0.91x, one of 64 KiB 1.05x, one of 48 KiB 1.31x: a pipe's set-up
// and the extra system calls cost more than the copies of a small body.
const DefaultSpliceMin = 128 << 10

func (c *Config) spliceMin() int64 {
	switch {
	case c.SpliceMin < 0:
		return 0
	case c.SpliceMin == 0:
		return DefaultSpliceMin
	}
	return c.SpliceMin
}

// maybeSplice hands the rest of the response body to a splice when it is
// large; u holds no unread byte (what it read went to the client).
func (c *clientConn) maybeSplice(u *upstreamConn) {
	r := c.r
	least := r.cfg.spliceMin()
	if least == 0 || r.splicing || u.s == nil {
		return
	}
	var n int64
	switch {
	case r.rp == rpLength && r.respLeft >= least:
		n = r.respLeft
	case r.rp == rpClose && r.res.BytesOut >= least:
		n = math.MaxInt64
	default:
		return
	}
	if u.s.SpliceTo(c.s, n) != nil {
		return // the body is copied as before
	}
	r.splicing, r.splIn, r.splMark = true, false, 0
}

// maybeSpliceBody hands the rest of a Content-Length request body to a
// splice from the client to u when it is large; c holds no unread byte
// (what it read went upstream).
func (c *clientConn) maybeSpliceBody(u *upstreamConn) {
	r := c.r
	least := r.cfg.spliceMin()
	// Not for an Upgrade request: a 101 turns the exchange into a tunnel
	// that needs every body byte taken from the client, and a splice that
	// ends early drops what its pipe holds.
	if least == 0 || r.splicing || r.bodyDone || r.bodyLeft < least || u.s == nil || c.s == nil ||
		r.head.BodyMode() != httpparse.BodyLength || r.head.Upgrade || !c.buf.empty() {
		return
	}
	if c.s.SpliceTo(u.s, r.bodyLeft) != nil {
		return // the body is copied as before
	}
	r.splicing, r.splIn, r.splMark = true, true, 0
}

// OnSpliced: the spliced part of the request body reached the upstream's
// socket, or the splice ended early.
func (c *clientConn) OnSpliced(_ *evloop.Sock, moved int64, err error) {
	r := c.r
	if r == nil || !r.splicing || !r.splIn {
		return // the exchange ended meanwhile (its upstream closed)
	}
	r.splicing, r.splIn = false, false
	r.bodyLeft -= moved
	r.res.BytesIn += moved
	switch {
	case err == nil:
		r.bodyDone = true
		c.bodySent()
		c.flow()
	case c.state != lcExchange, errors.Is(err, evloop.ErrSpliceDst):
		// The exchange ended (an early answer, an upstream failure), or
		// the upstream went away, whose own events end it.
	default:
		c.abort() // the client ended or failed before its body was complete
	}
}

// OnSpliced: the spliced part of the body reached the client's socket,
// or the splice ended early.
func (u *upstreamConn) OnSpliced(_ *evloop.Sock, moved int64, err error) {
	c := u.c
	if c == nil || c.r == nil || c.r.up != u {
		u.close() // never serves an exchange it is not part of
		return
	}
	r := c.r
	r.splicing = false
	r.res.BytesOut += moved
	if r.rp == rpLength {
		r.respLeft -= moved
	}
	switch {
	case err == nil && r.rp == rpLength:
		// Bytes already past the body poison u, as with a copied body.
		c.endResponse(u, u.s.Buffered())
	case errors.Is(err, evloop.ErrSpliceDst):
		r.upDrop() // the client went away under the splice
		c.abort()
	case err == io.EOF:
		c.upEOF(u, nil) // rpClose: the body's end; rpLength: truncated
	default:
		c.upEOF(u, err)
	}
}

// spliceProgress extends the exchange's idle deadline when its splice
// moved bytes since the deadline was set: a splice delivers no upData to
// do it.
func (c *clientConn) spliceProgress() bool {
	r := c.r
	s := c.s // the source: the client for a request body, else the upstream
	if !r.splIn && r.up != nil {
		s = r.up.s
	}
	if !r.splicing || s == nil || (!r.splIn && r.up == nil) {
		return false
	}
	m := s.SpliceMoved()
	if m <= r.splMark {
		return false
	}
	r.splMark = m
	c.setDeadline(c.ls.l.Now() + int64(r.svc.IdleTimeoutOrDefault()))
	return true
}
