package proxy

import (
	"errors"
	"io"
	"math"

	"github.com/rl-tproxy/rl-tproxy/pkg/evloop"
)

// Large response bodies go from the upstream's socket to the client's
// inside the kernel (evloop's Sock.SpliceTo: splice(2) through a pipe),
// not through the loop's buffers: a Content-Length body once at least
// Config.SpliceMin bytes of it are left after the bytes that came with
// the head, a close-delimited body once that many were relayed. Chunked
// bodies are decoded (their framing is checked), so they are copied.

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
func (c *lconn) maybeSplice(u *lup) {
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
	r.splicing, r.splMark = true, 0
}

// OnSpliced: the spliced part of the body reached the client's socket,
// or the splice ended early.
func (u *lup) OnSpliced(_ *evloop.Sock, moved int64, err error) {
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
func (c *lconn) spliceProgress() bool {
	r := c.r
	if !r.splicing || r.up == nil || r.up.s == nil {
		return false
	}
	m := r.up.s.SpliceMoved()
	if m <= r.splMark {
		return false
	}
	r.splMark = m
	c.setDeadline(c.ls.l.Now() + int64(r.svc.idleTimeout()))
	return true
}
