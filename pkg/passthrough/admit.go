package passthrough

import (
	"context"
	"time"

	"github.com/rl-tproxy/rl-tproxy/pkg/exchange"
)

// The admission deadline (exchange.Config.AdmissionTimeout, a Service's own
// winning). Admit's context carries it; when it passes first, the
// context's AfterFunc (expire, on the goroutine the context starts for
// it) reports "admission-timeout" (status 0: there is no HTTP to answer)
// and resets the client, which therefore does not wait for a Hook that
// ignores its context. The connection's goroutine stays in Admit until
// the Hook returns (the Request points into the proxy's read buffer,
// valid until ServeConn returns), and Done then reports the connection
// with Result.AdmissionErr set; nothing is relayed.

// admit asks the Hook once for the connection, within the admission
// timeout. It returns false when the Hook denied or did not decide in
// time (c.res.AdmissionErr set, the client already reset); a Decision
// that comes back once the deadline passed is not used.
func (c *conn) admit(hook exchange.Hook) bool {
	hc := c.hc
	c.req = exchange.Request{Remote: hc.Remote, Local: hc.Local, Peer: hc.Peer, Service: hc.Service, Start: hc.Start,
		Proto: exchange.ProtoTLSPassthrough, SNI: c.hello.SNI, ALPN: c.hello.FirstALPN()}
	d := hc.Config.AdmissionTimeoutFor(hc.Service)
	ctx := &c.actx
	ctx.Start(context.Background(), time.Now().Add(d))
	defer ctx.Finish()
	c.expiring.Add(1)
	stop := context.AfterFunc(ctx, c.expireAfter)
	c.dec = hook.Admit(ctx, &c.req)
	if stop() {
		c.expiring.Done()
		if ctx.Err() != nil {
			// The Decision came as the deadline passed, before the
			// AfterFunc started: it is not used either.
			c.expire()
		}
	} else {
		c.expiring.Wait() // the report and the reset are done
	}
	c.res = exchange.Result{}
	if ctx.Err() != nil { // only the deadline ends ctx
		c.res.AdmissionErr = exchange.AdmissionTimeoutError(d)
		return false
	}
	return c.dec.Allow
}

// expireAfter is expire as the context's AfterFunc.
func (c *conn) expireAfter() {
	defer c.expiring.Done()
	c.expire()
}

// expire ends a connection whose admission deadline passed before the
// Hook decided: it reports the rejection, then resets the client.
func (c *conn) expire() {
	hc := c.hc
	hc.Config.ReportReject(hc.Service, hc.Remote, "admission-timeout", 0)
	reset(hc.Conn)
}
