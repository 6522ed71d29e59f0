// The test peer of the server tests: a fake clock and a client that
// seals, sends and opens datagrams with the wire codec.

package rlserver

import (
	"bytes"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rl-tproxy/rl-tproxy/pkg/ratelimitly/credentials"
	"github.com/rl-tproxy/rl-tproxy/pkg/ratelimitly/wire"
)

// fakeClock is an injected clock advanced explicitly by tests.
type fakeClock struct{ ns atomic.Int64 }

func newClock() *fakeClock {
	c := &fakeClock{}
	c.ns.Store(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano())
	return c
}

func (c *fakeClock) Now() time.Time { return time.Unix(0, c.ns.Load()) }

func (c *fakeClock) Advance(d time.Duration) { c.ns.Add(int64(d)) }

func testCred(tenant string, id uint32, fill byte) credentials.Credential {
	c := credentials.Credential{Tenant: tenant, KeyID: id}
	for i := range c.Secret {
		c.Secret[i] = fill + byte(i)
	}
	return c
}

func startServer(t testing.TB, clk *fakeClock, mod func(*Config)) *Server {
	t.Helper()
	cfg := Config{
		Listen:      "127.0.0.1:0",
		Credentials: []credentials.Credential{testCred("acme", 1, 1), testCred("other", 2, 50)},
		Workers:     2,
		Now:         clk.Now,
	}
	if mod != nil {
		mod(&cfg)
	}
	s, err := Start(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// tclient is a minimal wire v1 client over one UDP socket.
type tclient struct {
	t    testing.TB
	conn *net.UDPConn
	key  *wire.Key
	clk  *fakeClock
	next uint64
	buf  []byte
}

func newClient(t testing.TB, s *Server, clk *fakeClock, cred credentials.Credential) *tclient {
	t.Helper()
	c, err := net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(s.Addr()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	k, err := wire.NewKey(cred.KeyID, cred.Secret)
	if err != nil {
		t.Fatal(err)
	}
	return &tclient{t: t, conn: c, key: k, clk: clk, next: 1000, buf: make([]byte, 0, wire.MaxDatagram)}
}

func (c *tclient) header(id uint64) wire.Header {
	return wire.Header{TTLms: 60, RequestID: id, Timestamp: uint64(c.clk.Now().UnixMilli())}
}

func (c *tclient) seal(h *wire.Header, b wire.Body) []byte {
	c.t.Helper()
	p, err := c.key.Seal(nil, h, b)
	if err != nil {
		c.t.Fatal(err)
	}
	return p
}

func (c *tclient) send(p []byte) {
	c.t.Helper()
	if _, err := c.conn.Write(p); err != nil {
		c.t.Fatal(err)
	}
}

// recv reads one response; the deadline only bounds a failing test.
func (c *tclient) recv() (wire.Header, wire.RateResponse, []byte) {
	c.t.Helper()
	buf := make([]byte, 2048)
	_ = c.conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	n, err := c.conn.Read(buf)
	if err != nil {
		c.t.Fatalf("no response: %v", err)
	}
	var h wire.Header
	pt, err := c.key.Open(buf[:n], &h)
	if err != nil {
		c.t.Fatalf("open response: %v", err)
	}
	if err := wire.CheckTime(&h, c.clk.Now(), wire.DefaultSkew); err != nil {
		c.t.Fatalf("response time: %v", err)
	}
	var r wire.RateResponse
	if h.Kind != wire.KindRateResponse {
		c.t.Fatalf("kind %v", h.Kind)
	}
	if err := r.DecodeBody(pt); err != nil {
		c.t.Fatalf("decode: %v", err)
	}
	return h, r, bytes.Clone(pt)
}

// do sends req with a fresh id and returns the answer.
func (c *tclient) do(req *wire.RateRequest) wire.RateResponse {
	c.t.Helper()
	c.next++
	h := c.header(c.next)
	c.send(c.seal(&h, req))
	rh, r, _ := c.recv()
	if rh.RequestID != c.next {
		c.t.Fatalf("answer for id %d, want %d", rh.RequestID, c.next)
	}
	return r
}

// sync returns once the server handled everything this client sent before:
// one socket is served by one worker, in order.
func (c *tclient) sync() {
	c.t.Helper()
	c.do(oneRes(res("sync", 1, 1, 1, 0)))
}

func res(bucket string, rate, period, burst, cost uint32) wire.Resource {
	return wire.Resource{Bucket: []byte(bucket), Rate: rate, PeriodMs: period, Burst: burst, Cost: cost}
}

func oneRes(r wire.Resource) *wire.RateRequest {
	return &wire.RateRequest{Resources: []wire.Resource{r}}
}

type want struct {
	success               bool
	remaining, def, retry uint32
}

func check(t *testing.T, step string, r wire.RateResponse, w want) {
	t.Helper()
	if r.Status != wire.StatusOK || len(r.Resources) != 1 {
		t.Fatalf("%s: status %d, %d resources", step, r.Status, len(r.Resources))
	}
	got := want{r.Success, r.Resources[0].Remaining, r.Resources[0].TokensDeficit, r.Resources[0].RetryAfterMs}
	if got != w {
		t.Fatalf("%s: got %+v, want %+v", step, got, w)
	}
}
