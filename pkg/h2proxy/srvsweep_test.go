package h2proxy_test

import (
	"context"
	"net"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rl-tproxy/rl-tproxy/internal/testkit"
	"github.com/rl-tproxy/rl-tproxy/pkg/exchange"
	"github.com/rl-tproxy/rl-tproxy/pkg/h2proxy"
)

// TestServerSweep: a reload that changes a service's HTTP/2 limits leaves
// the old configuration's server behind; the sweep stops it once it has
// no connection and served none since the previous sweep, never while a
// connection is open, and a configuration seen again gets a new server.
func TestServerSweep(t *testing.T) {
	up := startHTTP(t, false)
	svcA := &exchange.Service{Name: "s", Upstream: up, UpstreamProtocol: h2proxy.ProtoHTTP1, H2: exchange.H2Limits{MaxConcurrentStreams: 7}}
	svcB := &exchange.Service{Name: "s", Upstream: up, UpstreamProtocol: h2proxy.ProtoHTTP1, H2: exchange.H2Limits{MaxConcurrentStreams: 9}}
	var svc atomic.Pointer[exchange.Service]
	svc.Store(svcA)
	srv, addr := serveCurrent(t, &svc)
	get := func(cl *http.Client) {
		t.Helper()
		if st := getStatus(t, cl, "http://"+addr+"/"); st != 200 {
			t.Fatalf("status %d", st)
		}
	}

	var closedA atomic.Bool
	trA := h2cTransport()
	trA.DialContext = closeNoting(&closedA)
	// One connection, not a pool: if the sweep closed it, get fails.
	clA, ccA := h2cOneConn(t, trA, addr)
	get(clA) // its connection stays open
	svc.Store(svcB)
	clB := h2cClient()
	get(clB)
	if n := h2proxy.Servers(srv); n != 2 {
		t.Fatalf("%d HTTP/2 servers, want 2 (one per limit set)", n)
	}
	h2proxy.SweepServers(srv)
	h2proxy.SweepServers(srv)
	if n := h2proxy.Servers(srv); n != 2 {
		t.Fatalf("%d HTTP/2 servers after two sweeps with both connections open, want 2", n)
	}
	get(clA) // the open connection still works
	if closedA.Load() || ccA.Err() != nil {
		t.Fatalf("the sweep closed a connection of a server in use (closed %v, %v)", closedA.Load(), ccA.Err())
	}

	ccA.Close()
	testkit.WaitFor(t, "A's connection to end", func() bool { return h2proxy.ServerConns(srv) == 1 })
	h2proxy.SweepServers(srv)
	if n := h2proxy.Servers(srv); n != 1 {
		t.Fatalf("%d HTTP/2 servers after A's connection closed, want 1 (B's)", n)
	}
	get(clB)

	// A configuration seen again gets a server of its own again.
	svc.Store(svcA)
	clA2 := h2cClient()
	defer clA2.CloseIdleConnections()
	get(clA2)
	if n := h2proxy.Servers(srv); n != 2 {
		t.Fatalf("%d HTTP/2 servers after A came back, want 2", n)
	}

}

// TestServerSweepTimer: the sweep runs on its own, stopping the servers
// of configurations no connection uses.
func TestServerSweepTimer(t *testing.T) {
	sweep := *h2proxy.ServerSweep
	*h2proxy.ServerSweep = 10 * time.Millisecond
	t.Cleanup(func() { *h2proxy.ServerSweep = sweep })
	up := startHTTP(t, false)
	var svc atomic.Pointer[exchange.Service]
	srv, addr := serveCurrent(t, &svc)
	for i, streams := range []uint32{7, 9, 11} {
		svc.Store(&exchange.Service{Name: "s", Upstream: up, UpstreamProtocol: h2proxy.ProtoHTTP1, H2: exchange.H2Limits{MaxConcurrentStreams: streams}})
		cl := h2cClient()
		if st := getStatus(t, cl, "http://"+addr+"/"); st != 200 {
			t.Fatalf("round %d: status %d", i, st)
		}
		cl.CloseIdleConnections()
		testkit.WaitFor(t, "the sweep to stop every unused server", func() bool { return h2proxy.Servers(srv) == 0 })
	}
}

// closeNoting dials TCP and sets closed when the peer closes a
// connection (a read returning an error).
func closeNoting(closed *atomic.Bool) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return &noteConn{Conn: c, closed: closed}, nil
	}
}

type noteConn struct {
	net.Conn
	closed *atomic.Bool
	mine   atomic.Bool
}

func (c *noteConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if err != nil && !c.mine.Load() {
		c.closed.Store(true)
	}
	return n, err
}

func (c *noteConn) Close() error { c.mine.Store(true); return c.Conn.Close() }
