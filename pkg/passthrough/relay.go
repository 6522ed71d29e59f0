// Package passthrough serves the connections the proxy does not parse: it
// relays TLS (without terminating it) and other protocols unchanged to the
// service, or closes them, per service. A TLS ClientHello is read first
// (SNI, ALPN) so the connection can be admitted once through the proxy's
// Hook, like a request; the upstream connection may start with a PROXY
// protocol header; then bytes are spliced both ways. It is the proxy's
// Handoff for TLS and opaque connections.
package passthrough

import (
	"context"
	"errors"
	"io"
	"net"
	"net/netip"
	"sync"
	"time"

	"github.com/rl-tproxy/rl-tproxy/pkg/exchange"
	"github.com/rl-tproxy/rl-tproxy/pkg/sniff"
)

// Action is how a handed-off connection ended.
type Action uint8

const (
	Relayed   Action = iota // relayed to the upstream until both sides ended
	Rejected                // closed by the service's reject mode
	Denied                  // TLS admission denied: reset
	Malformed               // not a well-formed ClientHello (or too large): reset
	Timeout                 // the ClientHello did not arrive within the header timeout
	Failed                  // the upstream could not be reached: reset
	// AdmissionTimeout: the Hook gave no decision within the admission
	// timeout (exchange.Config.AdmissionTimeout): reset.
	AdmissionTimeout
)

var actionNames = [...]string{"relayed", "rejected", "denied", "malformed", "timeout", "upstream_error", "admission_timeout"}

func (a Action) String() string { return actionNames[a] }

// Event describes one connection when it ends.
type Event struct {
	Service       *exchange.Service
	Kind          sniff.Kind // sniff.TLS or sniff.Other
	Remote, Local netip.AddrPort
	SNI, ALPN     []byte // TLS: from the ClientHello (valid during the call)
	Action        Action
	// Admitted is true when the connection went through the Hook (whose
	// Done then wrote its access line).
	Admitted          bool
	Start, End        time.Time
	BytesIn, BytesOut int64 // client to upstream, upstream to client
	Err               error
}

// Relay is the Handoff for TLS and opaque connections.
type Relay struct {
	// Observe, if set, is called once per connection when it ends (for
	// metrics and the access line of connections the Hook never saw).
	Observe func(*Event)
}

// Takes implements exchange.Handoff: every TLS and opaque connection (the
// service's modes decide between relaying and closing).
func (r *Relay) Takes(kind sniff.Kind, _ *exchange.Service) bool {
	return kind == sniff.TLS || kind == sniff.Other
}

// modes resolves the service's mode for kind and whether TLS is read.
func modes(kind sniff.Kind, svc *exchange.Service) (mode exchange.ConnMode, readHello bool) {
	if kind == sniff.TLS && svc.TLS != exchange.ModeDefault {
		return svc.TLS, svc.TLS == exchange.ModePassthrough
	}
	if svc.Opaque == exchange.ModeReject {
		return exchange.ModeReject, false
	}
	return exchange.ModePassthrough, false
}

// conn is the state of one handed-off connection.
type conn struct {
	hc      *exchange.HandoffConn
	ev      Event
	hello   sniff.Hello
	req     exchange.Request
	dec     exchange.Decision
	res     exchange.Result
	scratch *[sniff.MaxHello + 4]byte
	// actx is Admit's context; expiring is held while expire runs
	// (admit.go).
	actx     exchange.AdmitContext
	expiring sync.WaitGroup
}

var scratchPool = sync.Pool{New: func() any { return new([sniff.MaxHello + 4]byte) }}

// ServeConn implements exchange.Handoff.
func (r *Relay) ServeConn(hc *exchange.HandoffConn) {
	c := &conn{hc: hc}
	cfg := hc.Config
	c.ev = Event{Service: hc.Service, Kind: hc.Kind, Remote: hc.Remote, Local: hc.Local, Start: hc.Start}
	defer func() {
		if c.ev.End.IsZero() {
			c.ev.End = time.Now()
		}
		if r.Observe != nil {
			r.Observe(&c.ev)
		}
		// Only now: Event.SNI and ALPN of a hello that spanned records
		// point into the scratch buffer.
		if c.scratch != nil {
			scratchPool.Put(c.scratch)
		}
	}()
	mode, readHello := modes(hc.Kind, hc.Service)
	if mode == exchange.ModeReject {
		c.ev.Action = Rejected
		reset(hc.Conn)
		return
	}
	data := hc.Buffered
	hook := cfg.Hook
	if readHello {
		c.scratch = scratchPool.Get().(*[sniff.MaxHello + 4]byte) // put back after Observe
		var ok bool
		if data, ok = c.readHello(data); !ok {
			reset(hc.Conn)
			return
		}
		if hook != nil {
			c.ev.Admitted = true
			if !c.admit(hook) {
				c.ev.Action = Denied
				if c.res.AdmissionErr != nil {
					c.ev.Action, c.ev.Err = AdmissionTimeout, c.res.AdmissionErr
				}
				reset(hc.Conn)
				c.done(hook)
				return
			}
		}
	}
	c.relay(data)
	if c.ev.Admitted {
		c.done(hook)
	}
}

// readHello reads until the whole ClientHello is buffered (within the
// header deadline the proxy armed) and parses it. data's spare capacity is
// the proxy's read buffer.
func (c *conn) readHello(data []byte) ([]byte, bool) {
	for {
		err := sniff.ParseHello(data, c.scratch[:], &c.hello)
		if err == nil {
			c.ev.SNI, c.ev.ALPN = c.hello.SNI, c.hello.FirstALPN()
			return data, true
		}
		if err != sniff.ErrNeedMore {
			c.ev.Action, c.ev.Err = Malformed, err
			return nil, false
		}
		if len(data) == cap(data) {
			c.ev.Action, c.ev.Err = Malformed, sniff.ErrTooLarge
			return nil, false
		}
		n, rerr := c.hc.Conn.Read(data[len(data):cap(data)])
		data = data[:len(data)+n]
		if rerr != nil && n == 0 {
			c.ev.Action, c.ev.Err = Timeout, rerr
			if !isTimeout(rerr) {
				c.ev.Action = Malformed // the client went away mid-hello
			}
			return nil, false
		}
	}
}

// done reports the connection's outcome to the Hook (access line,
// metrics, the latency report with the connection's duration).
func (c *conn) done(hook exchange.Hook) {
	c.res.End = c.ev.End
	if c.res.End.IsZero() {
		c.res.End = time.Now()
	}
	c.res.BytesIn, c.res.BytesOut = c.ev.BytesIn, c.ev.BytesOut
	c.res.UpstreamErr = nil
	if c.ev.Action == Failed {
		c.res.UpstreamErr = c.ev.Err
	}
	hook.Done(&c.req, &c.dec, &c.res)
}

// relay dials the upstream, writes the PROXY header and the buffered
// bytes, then copies both ways until both directions ended.
func (c *conn) relay(data []byte) {
	hc := c.hc
	svc, cfg := hc.Service, hc.Config
	timeout := svc.UpstreamTimeoutOrDefault()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	up, err := cfg.DialUpstream(ctx, svc.Upstream)
	cancel()
	if err == nil {
		err = exchange.WriteProxyHeader(up, svc, hc.Remote, hc.Local, timeout)
		if err == nil && len(data) > 0 {
			up.SetWriteDeadline(time.Now().Add(timeout))
			_, err = up.Write(data)
			up.SetWriteDeadline(time.Time{})
		}
		if err != nil {
			up.Close()
		}
	}
	c.res.Upstream = svc.Upstream
	if err != nil {
		c.ev.Action, c.ev.Err = Failed, err
		reset(hc.Conn)
		c.ev.End = time.Now()
		return
	}
	c.ev.BytesIn = int64(len(data))
	hc.Conn.SetReadDeadline(time.Time{})
	in, out := pipe(hc.Conn, up, svc.IdleTimeoutOrDefault())
	c.ev.BytesIn += in
	c.ev.BytesOut = out
	c.ev.Action = Relayed
	c.ev.End = time.Now()
}

// pipe copies client->up in a goroutine and up->client here (splice(2)
// between TCP sockets: io.Copy uses TCPConn.ReadFrom). When one direction
// ends cleanly its write side is shut down and the other direction gets
// grace to end too (a peer that never closes its side cannot hold the
// connection open forever); an error on either side closes both.
func pipe(client, up net.Conn, grace time.Duration) (in, out int64) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		var err error
		in, err = io.Copy(up, client)
		if err != nil {
			up.Close()
			client.Close()
			return
		}
		closeWrite(up)
		up.SetReadDeadline(time.Now().Add(grace))
	}()
	out, err := io.Copy(client, up)
	if err != nil {
		up.Close()
		client.Close()
	} else {
		closeWrite(client)
		client.SetReadDeadline(time.Now().Add(grace))
	}
	<-done
	up.Close()
	return in, out
}

func closeWrite(c net.Conn) {
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		cw.CloseWrite()
	}
}

// reset closes c with a TCP reset (SO_LINGER 0): a refused TLS client
// sees a failed connection at once, not a truncated handshake.
func reset(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		tc.SetLinger(0)
	}
	c.Close()
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}
