package proxy

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/netip"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rl-tproxy/rl-tproxy/internal/testkit"
	"github.com/rl-tproxy/rl-tproxy/pkg/exchange"
)

// namedUpstream answers every request on a connection with body and
// counts the connections it saw close.
func namedUpstream(t *testing.T, body string, closed *atomic.Int32) *rawUpstream {
	return newRawUpstream(t, func(_ int, c net.Conn) {
		br := bufio.NewReader(c)
		for {
			if _, err := readRequestHead(br); err != nil {
				closed.Add(1)
				return
			}
			io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\n"+body)
		}
	})
}

// pruneNow ages the idle connections of the pools whose address is addr
// past the idle timeout and runs their prune, as their timer would.
func pruneNow(p *Proxy, addr string) {
	p.lg.each(func(ls *loopState) {
		if pl := ls.pools[addr]; pl != nil {
			for _, u := range pl.idle {
				u.idleSince -= int64(time.Hour)
			}
			pl.prune()
		}
	})
}

// poolAddrs lists the upstream addresses the loops keep pools for.
func poolAddrs(p *Proxy) []string {
	var addrs []string
	p.lg.each(func(ls *loopState) {
		for a := range ls.pools {
			addrs = append(addrs, a)
		}
	})
	return addrs
}

// TestPoolForgotten: after a reload moves a service to another upstream,
// the old upstream's pool is dropped once its idle connection closed
// (poolForget later), while the pool in use keeps its connection; a pool
// with a request in flight and no idle connection is never dropped.
func TestPoolForgotten(t *testing.T) {
	forget := poolForget
	poolForget = 0
	t.Cleanup(func() { poolForget = forget })
	var closedA, closedB atomic.Int32
	upA, upB := namedUpstream(t, "A", &closedA), namedUpstream(t, "B", &closedB)
	var cfg Config
	p, addr := startProxy(t, nil, &exchange.Service{Upstream: upA.addr()}, func(c *Config) {
		c.EventLoops = 1
		c.UpstreamIdleTimeout = time.Hour
		cfg = *c
	})
	cl := dialClient(t, addr)
	cl.send("GET / HTTP/1.1\r\nHost: x\r\n\r\n")
	if _, body := cl.resp("GET"); body != "A" {
		t.Fatalf("first request answered %q, want A", body)
	}
	cfg.Services = []*exchange.Service{{Name: "web", Upstream: upB.addr()}}
	if err := p.Update(cfg); err != nil {
		t.Fatal(err)
	}
	cl.send("GET / HTTP/1.1\r\nHost: x\r\n\r\n")
	if _, body := cl.resp("GET"); body != "B" {
		t.Fatalf("after the reload answered %q, want B", body)
	}
	if st := p.Stats(); st.UpstreamPools != 2 || st.UpstreamIdle != 2 {
		t.Fatalf("before pruning: %d pools, %d idle connections; want 2, 2", st.UpstreamPools, st.UpstreamIdle)
	}

	pruneNow(p, upA.addr())
	testkit.WaitFor(t, "the pool of the upstream no longer used to go", func() bool {
		return p.Stats().UpstreamPools == 1
	})
	if a := poolAddrs(p); len(a) != 1 || a[0] != upB.addr() {
		t.Fatalf("pools left for %v, want only %s", a, upB.addr())
	}
	testkit.WaitFor(t, "upstream A to see its pooled connection closed", func() bool { return closedA.Load() == 1 })
	cl.send("GET / HTTP/1.1\r\nHost: x\r\n\r\n")
	if _, body := cl.resp("GET"); body != "B" || upB.count() != 1 || closedB.Load() != 0 {
		t.Fatalf("answered %q on %d connections to B (%d closed); want B reusing its one open connection", body, upB.count(), closedB.Load())
	}

	// In flight, not idle: the pool's prune runs with nothing idle and
	// poolForget long past, and must keep it.
	entered, release := make(chan struct{}), make(chan struct{})
	upC := newRawUpstream(t, func(_ int, c net.Conn) {
		if _, err := readRequestHead(bufio.NewReader(c)); err != nil {
			return
		}
		close(entered)
		<-release
		io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\nC")
	})
	cfg.Services = []*exchange.Service{{Name: "web", Upstream: upC.addr()}}
	if err := p.Update(cfg); err != nil {
		t.Fatal(err)
	}
	cl.send("GET / HTTP/1.1\r\nHost: x\r\n\r\n")
	<-entered
	pruneNow(p, upC.addr())
	kept := false
	for _, a := range poolAddrs(p) {
		kept = kept || a == upC.addr()
	}
	close(release)
	if _, body := cl.resp("GET"); body != "C" || !kept {
		t.Fatalf("answered %q; pool kept while in flight: %v", body, kept)
	}
}

// TestPoolForgottenHost: a forgotten pool takes its host name's addresses
// with it; the next request looks the name up again.
func TestPoolForgottenHost(t *testing.T) {
	forget := poolForget
	poolForget = 0
	t.Cleanup(func() { poolForget = forget })
	var closed atomic.Int32
	up := namedUpstream(t, "A", &closed)
	var lookups atomic.Int32
	p, addr := startProxy(t, nil, &exchange.Service{Upstream: hostUpstream(up)}, func(c *Config) {
		c.EventLoops = 1
		c.ResolveTTL = time.Hour
		c.Resolve = func(context.Context, string) ([]netip.Addr, error) {
			lookups.Add(1)
			return []netip.Addr{netip.MustParseAddr("127.0.0.1")}, nil
		}
	})
	if st := get(t, addr); st != 200 {
		t.Fatalf("status %d", st)
	}
	pruneNow(p, hostUpstream(up))
	testkit.WaitFor(t, "the host name's pool to go", func() bool { return p.Stats().UpstreamPools == 0 })
	if st := get(t, addr); st != 200 || lookups.Load() != 2 {
		t.Fatalf("status %d after %d lookups; want 200 after a second lookup", st, lookups.Load())
	}
}

// TestPoolIdleAfterEmpty: a pool whose last connection closed has its
// timer armed to forget it (a minute); a connection pooled after that
// is still closed at the idle timeout, not at the forget time.
func TestPoolIdleAfterEmpty(t *testing.T) {
	gone := make(chan struct{}, 1)
	up := newRawUpstream(t, func(n int, c net.Conn) {
		br := bufio.NewReader(c)
		if n == 1 { // the first connection closes after its answer
			if _, err := readRequestHead(br); err == nil {
				io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")
			}
			return
		}
		for {
			if _, err := readRequestHead(br); err != nil {
				gone <- struct{}{}
				return
			}
			io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
		}
	})
	p, addr := startProxy(t, nil, &exchange.Service{Upstream: up.addr()}, func(c *Config) {
		c.EventLoops = 1
		c.UpstreamIdleTimeout = 20 * time.Millisecond
	})
	for i := range 2 {
		if st := get(t, addr); st != 200 {
			t.Fatalf("request %d: status %d", i, st)
		}
	}
	testkit.WaitFor(t, "the pooled connection to close at the idle timeout", func() bool {
		select {
		case <-gone:
			return true
		default:
			return false
		}
	})
	if st := p.Stats(); st.UpstreamIdle != 0 || st.UpstreamPools != 1 {
		t.Fatalf("%d idle connections, %d pools; want 0, 1 (forgotten only after poolForget)", st.UpstreamIdle, st.UpstreamPools)
	}
}
