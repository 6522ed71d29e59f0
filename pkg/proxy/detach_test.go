package proxy

import (
	"bufio"
	"context"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/rl-tproxy/rl-tproxy/pkg/sniff"
)

// echoUpgradeUpstream answers a 101 and then echoes what it receives.
func echoUpgradeUpstream(t *testing.T) *rawUpstream {
	return newRawUpstream(t, func(_ int, c net.Conn) {
		br := bufio.NewReader(c)
		if _, err := readRequestHead(br); err != nil {
			return
		}
		io.WriteString(c, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n")
		io.Copy(c, br)
	})
}

// openTunnel upgrades a client connection and checks one echo through
// the tunnel (its goroutine then relays).
func openTunnel(t *testing.T, addr string) *client {
	t.Helper()
	cl := dialClient(t, addr)
	cl.send("GET /ws HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n")
	head, err := readRequestHead(cl.br)
	if err != nil || !strings.HasPrefix(head, "HTTP/1.1 101 ") {
		t.Fatalf("upgrade answered %q %v", head, err)
	}
	cl.send("ping")
	b := make([]byte, 4)
	if _, err := io.ReadFull(cl.br, b); err != nil || string(b) != "ping" {
		t.Fatalf("echo %q %v", b, err)
	}
	return cl
}

// blockingHandoff takes TLS and reads until its connection is closed
// (it ignores Drain), signalling once it serves.
type blockingHandoff struct{ serving chan struct{} }

func (blockingHandoff) Takes(k sniff.Kind, _ *Service) bool { return k == sniff.TLS }
func (h blockingHandoff) ServeConn(hc *HandoffConn) {
	hc.Conn.SetReadDeadline(time.Time{})
	h.serving <- struct{}{}
	io.Copy(io.Discard, hc.Conn)
}

// shutdownNow runs Shutdown past its deadline and waits (bounded) for it.
func shutdownNow(t *testing.T, p *Proxy) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	done := make(chan error, 1)
	go func() { done <- p.Shutdown(ctx) }()
	select {
	case err := <-done:
		if err != context.Canceled {
			t.Fatalf("Shutdown: %v, want the context's error", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("Shutdown did not return; conns = %d", p.lg.conns.Load())
	}
	if n := p.lg.conns.Load(); n != 0 {
		t.Fatalf("conns = %d after Shutdown", n)
	}
}

// Shutdown past its deadline ends connections that left their loop
// (upgrade tunnel, handoff) through their goroutine, which releases them
// once: no double release, no negative count, and Shutdown returns.
func TestForcedShutdownDetached(t *testing.T) {
	t.Run("tunnel", func(t *testing.T) {
		hook := newTestHook(nil)
		p, addr := startProxy(t, hook, &Service{Upstream: echoUpgradeUpstream(t).addr()}, func(c *Config) { c.EventLoops = 1 })
		openTunnel(t, addr)
		shutdownNow(t, p)
		if d := hook.waitDone(t); d.status != 101 {
			t.Fatalf("Done status %d, want 101", d.status)
		}
	})
	t.Run("handoff", func(t *testing.T) {
		h := blockingHandoff{serving: make(chan struct{}, 1)}
		up := newRawUpstream(t, func(int, net.Conn) {})
		p, addr := startProxy(t, nil, &Service{Upstream: up.addr()}, func(c *Config) { c.EventLoops = 1; c.Handoff = h })
		cl := dialClient(t, addr)
		cl.send("\x16\x03\x01\x00\x20\x01rest")
		select {
		case <-h.serving:
		case <-time.After(10 * time.Second):
			t.Fatal("the handoff did not start")
		}
		shutdownNow(t, p)
	})
}
