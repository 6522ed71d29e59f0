package proxy

import (
	"net"
	"testing"

	"github.com/rl-tproxy/rl-tproxy/internal/testkit"
	"github.com/rl-tproxy/rl-tproxy/pkg/exchange"
)

// holdP asks p's holdP for its first loop, once the loops run.
func holdP(t *testing.T, p *Proxy) bool {
	t.Helper()
	testkit.WaitFor(t, "the loops to start", func() bool { return p.lg.started.Load() != nil })
	p.lg.mu.Lock()
	l := p.lg.loops[0].l
	p.lg.mu.Unlock()
	return p.lg.holdP(l)
}

// TestHoldP: the loops may hold their P in a kernel wait only while
// Config.HoldP says so and no connection is served by a goroutine: a
// handoff (TLS here) and an Upgrade tunnel each turn it off for as long
// as they run, and it comes back once they ended; without Config.HoldP
// it is never on. With Config.HoldPInFlight a loop holding more requests
// in progress than that parks, and the kernel wait comes back once they
// finished.
func TestHoldP(t *testing.T) {
	t.Run("no HoldP", func(t *testing.T) {
		p, addr := startProxy(t, nil, &exchange.Service{Upstream: newRawUpstream(t, func(int, net.Conn) {}).addr()},
			func(c *Config) { c.EventLoops = 1 })
		dialClient(t, addr).c.Close() // the loops are running
		if holdP(t, p) {
			t.Fatal("holdP true without Config.HoldP")
		}
	})
	t.Run("handoff", func(t *testing.T) {
		h := blockingHandoff{serving: make(chan struct{}, 1)}
		up := newRawUpstream(t, func(int, net.Conn) {})
		p, addr := startProxy(t, nil, &exchange.Service{Upstream: up.addr()}, func(c *Config) {
			c.EventLoops, c.Handoff = 1, h
			c.HoldP = func() bool { return true }
		})
		if !holdP(t, p) {
			t.Fatal("holdP false with nothing served off the loops")
		}
		cl := h.start(t, addr)
		if holdP(t, p) {
			t.Fatal("holdP true while a handed-off connection is served by a goroutine")
		}
		cl.c.Close()
		testkit.WaitFor(t, "holdP back once the handoff ended", func() bool { return holdP(t, p) })
	})
	t.Run("tunnel", func(t *testing.T) {
		p, addr := startProxy(t, newTestHook(nil), &exchange.Service{Upstream: echoUpgradeUpstream(t).addr()}, func(c *Config) {
			c.EventLoops = 1
			c.HoldP = func() bool { return true }
		})
		cl := openTunnel(t, addr)
		if holdP(t, p) {
			t.Fatal("holdP true while an Upgrade tunnel relays on goroutines")
		}
		cl.c.Close()
		testkit.WaitFor(t, "holdP back once the tunnel ended", func() bool { return holdP(t, p) })
	})
	t.Run("in flight", func(t *testing.T) {
		accepted, release := make(chan struct{}, 3), make(chan struct{})
		up := newRawUpstream(t, func(_ int, c net.Conn) {
			accepted <- struct{}{}
			<-release // the request stays in progress until then
		})
		p, addr := startProxy(t, nil, &exchange.Service{Upstream: up.addr()}, func(c *Config) {
			c.EventLoops = 1
			c.HoldP = func() bool { return true }
			c.HoldPInFlight = 1
		})
		var cls []*client
		for n := 1; n <= 2; n++ {
			cl := dialClient(t, addr)
			cl.send("GET / HTTP/1.1\r\nHost: x\r\n\r\n")
			<-accepted
			cls = append(cls, cl)
			if got, want := holdP(t, p), n <= 1; got != want {
				t.Fatalf("%d requests in progress (Stats.Requests %d), HoldPInFlight 1: holdP %v, want %v",
					n, p.Stats().Requests, got, want)
			}
		}
		if got := p.Stats().Requests; got != 2 {
			t.Fatalf("Stats.Requests %d with two requests at the upstream, want 2", got)
		}
		close(release)
		for _, cl := range cls {
			if r, _ := cl.resp("GET"); r.StatusCode != 502 {
				t.Fatalf("status %d after the upstream closed, want 502", r.StatusCode)
			}
		}
		testkit.WaitFor(t, "no request in progress", func() bool { return p.Stats().Requests == 0 })
		if !holdP(t, p) {
			t.Fatal("holdP false once the requests finished")
		}
	})
}
