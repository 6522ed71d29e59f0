package proxy

import (
	"context"
	"time"

	"github.com/rl-tproxy/rl-tproxy/pkg/exchange"
)

// The admission deadline (Config.AdmissionTimeout). A Hook that never
// answers must not hold a connection (nor, for a blocking Hook, a worker
// goroutine) for ever: when the deadline passes the admission is
// cancelled, the client is answered 503 and the connection closes once
// that is out. The request itself stays with its connection until the
// Hook answers after all (r and d are the Hook's until Resume), and Done
// then reports it with Result.AdmissionErr.

// admitDeadline arms the admission deadline of c's request; a blocking
// Hook's Admit context carries it.
func (c *clientConn) admitDeadline(cfg *Config) {
	d := cfg.AdmissionTimeoutFor(c.r.svc)
	c.setDeadline(c.ls.l.Now() + int64(d))
	if _, ok := c.r.hook.(AsyncHook); !ok {
		if c.r.actx == nil {
			c.r.actx = new(exchange.AdmitContext)
		}
		c.r.actx.Start(context.Background(), time.Now().Add(d))
	}
}

// admitTimeout: no Decision within the admission timeout.
func (c *clientConn) admitTimeout() {
	r := c.r
	if !r.pending {
		return // the Decision is being acted on
	}
	d := r.cfg.AdmissionTimeoutFor(r.svc)
	r.res.AdmissionErr = exchange.AdmissionTimeoutError(d)
	r.cfg.Log().Debug("admission timed out", "service", r.svc.Name, "remote", c.remote, "timeout", d)
	if !r.cancelled {
		r.cancelled = true // at most once per Begin (AsyncHook)
		if r.async != nil {
			r.async.Cancel(&r.req)
		} else {
			r.actx.Cancel(context.DeadlineExceeded)
		}
	}
	r.cfg.ReportReject(r.svc, c.remote, "admission-timeout", 503)
	c.answer(503, "Connection: close\r\n")
	c.linger = true
	c.complete(false) // finishRequest closes without reporting: the Decision is still due
}

// lateDecision: the Decision of a request whose admission timed out came
// back (admitDone). It is not acted on; Done reports the request once the
// 503 is out (finishRequest then left it pending), at once if it is.
func (c *clientConn) lateDecision() {
	r := c.r
	switch c.state {
	case lcFlush, lcAdmit:
		// the 503 is being written (or about to be, a Resume from inside
		// Cancel): finishRequest reports it
	case lcGone:
		c.close()
	default: // lcClosing: the 503 is out, the connection lingers
		r.res.End = c.ls.now(r.cfg)
		r.hook.Done(&r.req, &r.dec, &r.res)
		c.r = nil
		c.ls.putReq(r)
		c.buf.put(c.ls) // kept for r's head (closeGraceful)
	}
}
