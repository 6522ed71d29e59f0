package proxy

import (
	"bufio"
	"context"
	"io"
	"net"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/rl-tproxy/rl-tproxy/pkg/exchange"
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

func (blockingHandoff) Takes(k sniff.Kind, _ *exchange.Service) bool { return k == sniff.TLS }

// start opens a connection to addr that h takes and waits until h serves it.
func (h blockingHandoff) start(t *testing.T, addr string) *client {
	t.Helper()
	cl := dialClient(t, addr)
	cl.send("\x16\x03\x01\x00\x20\x01rest")
	select {
	case <-h.serving:
	case <-time.After(10 * time.Second):
		t.Fatal("the handoff did not start")
	}
	return cl
}
func (h blockingHandoff) ServeConn(hc *exchange.HandoffConn) {
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
		p, addr := startProxy(t, hook, &exchange.Service{Upstream: echoUpgradeUpstream(t).addr()}, func(c *Config) { c.EventLoops = 1 })
		openTunnel(t, addr)
		shutdownNow(t, p)
		if d := hook.waitDone(t); d.status != 101 {
			t.Fatalf("Done status %d, want 101", d.status)
		}
	})
	t.Run("handoff", func(t *testing.T) {
		h := blockingHandoff{serving: make(chan struct{}, 1)}
		up := newRawUpstream(t, func(int, net.Conn) {})
		p, addr := startProxy(t, nil, &exchange.Service{Upstream: up.addr()}, func(c *Config) { c.EventLoops = 1; c.Handoff = h })
		h.start(t, addr)
		shutdownNow(t, p)
	})
}

// A tunnel is bounded: it ends when no byte moves either way for the
// tunnel idle bound and when a side does not take the bytes written to
// it; an upgrade whose 1xx flood the client does not read never becomes
// a tunnel and ends at the exchange's idle bound.
func TestTunnelBounded(t *testing.T) {
	const switching = "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n"
	interim := "HTTP/1.1 102 Processing\r\nX-Pad: " + strings.Repeat("p", 4000) + "\r\n\r\n"
	for _, tc := range []struct {
		name        string
		upstream    func(c net.Conn)
		readHead    bool // the client reads the 101 (else it never reads)
		wantStatus  int
		wantAborted bool
	}{
		{"silent-peers", func(c net.Conn) {
			io.WriteString(c, switching)
			io.Copy(io.Discard, c)
		}, true, 101, false},
		{"client-never-reads-tunnel", func(c net.Conn) {
			io.WriteString(c, switching)
			b := make([]byte, 64<<10)
			for {
				if _, err := c.Write(b); err != nil {
					return
				}
			}
		}, true, 101, false},
		// 8 MiB of 1xx, then the 101, to a client that reads nothing: the
		// proxy relays httpparse.MaxInterims of them and ends the exchange with 502,
		// so the 101 never arrives and nothing more is queued.
		{"client-never-reads-interim", func(c net.Conn) {
			for range (8 << 20) / len(interim) {
				if _, err := io.WriteString(c, interim); err != nil {
					return
				}
			}
			io.WriteString(c, switching)
			io.Copy(io.Discard, c)
		}, false, 502, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			up := newRawUpstream(t, func(_ int, c net.Conn) {
				if _, err := readRequestHead(bufio.NewReader(c)); err != nil {
					return
				}
				tc.upstream(c)
			})
			hook := newTestHook(nil)
			svc := &exchange.Service{Upstream: up.addr()}
			if !tc.readHead {
				svc.IdleTimeout = 100 * time.Millisecond
			}
			_, addr := startProxy(t, hook, svc, func(c *Config) {
				c.EventLoops = 1
				c.TunnelIdleTimeout = 50 * time.Millisecond
			})
			d := net.Dialer{Control: func(_, _ string, rc syscall.RawConn) error {
				rc.Control(func(fd uintptr) { syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4096) })
				return nil
			}}
			nc, err := d.Dial("tcp", addr)
			if err != nil {
				t.Fatal(err)
			}
			defer nc.Close()
			io.WriteString(nc, "GET /ws HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n")
			if tc.readHead {
				nc.SetReadDeadline(time.Now().Add(10 * time.Second))
				if head, err := readRequestHead(bufio.NewReader(nc)); err != nil || !strings.HasPrefix(head, "HTTP/1.1 101 ") {
					t.Fatalf("upgrade answered %q %v", head, err)
				}
			}
			done := hook.waitDone(t) // bounded
			if done.status != tc.wantStatus || done.clientAborted != tc.wantAborted {
				t.Fatalf("Done: status %d, client aborted %v; want %d, %v", done.status, done.clientAborted, tc.wantStatus, tc.wantAborted)
			}
		})
	}
}
