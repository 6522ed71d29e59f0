package embedded

import (
	"context"
	"crypto/rand"
	"io"
	"log/slog"
	"net"
	"testing"
	"time"

	"github.com/rl-tproxy/rl-tproxy/internal/testkit"
	"github.com/rl-tproxy/rl-tproxy/pkg/evloop"
	"github.com/rl-tproxy/rl-tproxy/pkg/ratelimitly"
	"github.com/rl-tproxy/rl-tproxy/pkg/ratelimitly/credentials"
	"github.com/rl-tproxy/rl-tproxy/pkg/ratelimitly/wire"
	"github.com/rl-tproxy/rl-tproxy/pkg/rlclient"
)

// eachBackend runs fn per event-loop backend.
func eachBackend(t *testing.T, fn func(t *testing.T, be evloop.Backend)) {
	for _, be := range []evloop.Backend{evloop.Epoll, evloop.IOUring} {
		t.Run(be.String(), func(t *testing.T) { fn(t, be) })
	}
}

// startLoops starts an evloop group; it closes with the test.
func startLoops(t *testing.T, be evloop.Backend, n int) *evloop.Group {
	t.Helper()
	g, err := evloop.Start(evloop.Config{Loops: n, Backend: be, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		if be == evloop.IOUring {
			testkit.Missing(t, "io_uring refused on this machine: %v", err)
		}
		t.Fatal(err)
	}
	if g.Backend() != be {
		testkit.Missing(t, "backend %s fell back to %s", be, g.Backend())
	}
	t.Cleanup(func() { _ = g.Close() })
	return g
}

// on runs fn on l's thread and waits for it (bounded).
func on(t *testing.T, l *evloop.Loop, fn func()) {
	t.Helper()
	done := make(chan struct{})
	l.Post(func() { fn(); close(done) })
	select {
	case <-done:
	case <-time.After(testkit.WaitBound):
		t.Fatalf("loop %d did not run a posted function", l.ID())
	}
}

// attach runs AttachLoop on every loop and returns the detach functions.
func attach(t *testing.T, g *evloop.Group, a *LoopAttacher) []func() {
	t.Helper()
	var ds []func()
	for _, l := range g.Loops() {
		var d func()
		var err error
		on(t, l, func() { d, err = a.AttachLoop(l) })
		if err != nil {
			t.Fatalf("attach loop %d: %v", l.ID(), err)
		}
		ds = append(ds, d)
	}
	return ds
}

func detach(t *testing.T, g *evloop.Group, ds []func()) {
	t.Helper()
	for i, l := range g.Loops() {
		if ds[i] != nil {
			on(t, l, ds[i])
		}
	}
}

func testCred(t *testing.T) credentials.Credential {
	t.Helper()
	c := credentials.Credential{Tenant: "embedded", KeyID: 9}
	if _, err := rand.Read(c.Secret[:]); err != nil {
		t.Fatal(err)
	}
	return c
}

func startLoopDriven(t *testing.T, loops int, c credentials.Credential) *Embedded {
	t.Helper()
	e, err := Start(Config{Credentials: []credentials.Credential{c}, Loops: loops})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.Close() })
	if e.LoopAttacher() == nil || len(e.Server.Sockets()) != loops {
		t.Fatalf("attacher %v, %d sockets", e.LoopAttacher(), len(e.Server.Sockets()))
	}
	return e
}

// rawPeer speaks wire v1 over one UDP socket, for datagrams rlclient
// would never send.
type rawPeer struct {
	t    *testing.T
	conn *net.UDPConn
	key  *wire.Key
}

func newRawPeer(t *testing.T, e *Embedded, c credentials.Credential) *rawPeer {
	t.Helper()
	conn, err := net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(e.Server.Addr()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	k, err := wire.NewKey(c.KeyID, c.Secret)
	if err != nil {
		t.Fatal(err)
	}
	return &rawPeer{t: t, conn: conn, key: k}
}

func (p *rawPeer) seal(id uint64) []byte {
	p.t.Helper()
	h := wire.Header{TTLms: 5000, RequestID: id, Timestamp: uint64(time.Now().UnixMilli())}
	req := &wire.RateRequest{Resources: []wire.Resource{{Bucket: []byte("raw"), Rate: 1e6, PeriodMs: 1000, Burst: 1e6, Cost: 1}}}
	b, err := p.key.Seal(nil, &h, req)
	if err != nil {
		p.t.Fatal(err)
	}
	return b
}

func (p *rawPeer) send(b []byte) {
	p.t.Helper()
	if _, err := p.conn.Write(b); err != nil {
		p.t.Fatal(err)
	}
}

// recv returns the request id of the next answer (the deadline only
// bounds a failing test).
func (p *rawPeer) recv() uint64 {
	p.t.Helper()
	buf := make([]byte, 2048)
	_ = p.conn.SetReadDeadline(time.Now().Add(testkit.WaitBound))
	n, err := p.conn.Read(buf)
	if err != nil {
		p.t.Fatalf("no answer: %v", err)
	}
	var h wire.Header
	if _, err := p.key.Open(buf[:n], &h); err != nil {
		p.t.Fatalf("open answer: %v", err)
	}
	return h.RequestID
}

func newClient(t *testing.T, e *Embedded, c credentials.Credential) *rlclient.Client {
	t.Helper()
	cl, err := rlclient.New(rlclient.Config{SRV: e.SRV, Resolver: e.Resolver, Credential: c,
		Policy: ratelimitly.Standard(200 * time.Millisecond), Shards: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cl.Close() })
	testkit.WaitFor(t, "client discovery", cl.Ready)
	return cl
}

// check runs one decision through the real client.
func check(t *testing.T, cl *rlclient.Client, bucket string, burst uint32) rlclient.Cause {
	t.Helper()
	req := &wire.RateRequest{Resources: []wire.Resource{{Bucket: []byte(bucket), Rate: 1, PeriodMs: 60000, Burst: burst, Cost: 1}}}
	var d rlclient.Decision
	if err := cl.Check(context.Background(), req, &d); err != nil && !d.Cause.Decided() {
		t.Fatalf("check: %v (%v)", err, d.Cause)
	}
	return d.Cause
}
