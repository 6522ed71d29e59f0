package proxy

import (
	"net"
	"testing"

	"github.com/rl-tproxy/rl-tproxy/internal/testkit"
)

// TestHoldP: the loops may hold their P in a kernel wait only while
// Config.HoldP says so and no connection is served by a goroutine: a
// handoff (TLS here) and an Upgrade tunnel each turn it off for as long
// as they run, and it comes back once they ended; without Config.HoldP
// it is never on.
func TestHoldP(t *testing.T) {
	t.Run("no HoldP", func(t *testing.T) {
		p, addr := startProxy(t, nil, &Service{Upstream: newRawUpstream(t, func(int, net.Conn) {}).addr()},
			func(c *Config) { c.EventLoops = 1 })
		dialClient(t, addr).c.Close() // the loops are running
		if p.lg.holdP() {
			t.Fatal("holdP true without Config.HoldP")
		}
	})
	t.Run("handoff", func(t *testing.T) {
		h := blockingHandoff{serving: make(chan struct{}, 1)}
		up := newRawUpstream(t, func(int, net.Conn) {})
		p, addr := startProxy(t, nil, &Service{Upstream: up.addr()}, func(c *Config) {
			c.EventLoops, c.Handoff = 1, h
			c.HoldP = func() bool { return true }
		})
		if !p.lg.holdP() {
			t.Fatal("holdP false with nothing served off the loops")
		}
		cl := h.start(t, addr)
		if p.lg.holdP() {
			t.Fatal("holdP true while a handed-off connection is served by a goroutine")
		}
		cl.c.Close()
		testkit.WaitFor(t, "holdP back once the handoff ended", p.lg.holdP)
	})
	t.Run("tunnel", func(t *testing.T) {
		p, addr := startProxy(t, newTestHook(nil), &Service{Upstream: echoUpgradeUpstream(t).addr()}, func(c *Config) {
			c.EventLoops = 1
			c.HoldP = func() bool { return true }
		})
		cl := openTunnel(t, addr)
		if p.lg.holdP() {
			t.Fatal("holdP true while an Upgrade tunnel relays on goroutines")
		}
		cl.c.Close()
		testkit.WaitFor(t, "holdP back once the tunnel ended", p.lg.holdP)
	})
}
