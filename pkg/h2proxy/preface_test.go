package h2proxy_test

import (
	"context"
	"io"
	"net"
	"testing"
	"time"

	"github.com/rl-tproxy/rl-tproxy/pkg/exchange"
	"github.com/rl-tproxy/rl-tproxy/pkg/h2proxy"
)

// handoffProxy is the dispatcher's view: it reads the first n bytes of a
// connection itself and hands them over with the connection.
func handoffProxy(t *testing.T, svc *exchange.Service, n int) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := h2proxy.New()
	cfg := &exchange.Config{Services: []*exchange.Service{svc}, Hook: &rec{}}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				buf := make([]byte, n)
				m, _ := io.ReadFull(c, buf)
				srv.Serve(c, buf[:m], svc, cfg)
			}()
		}
	}()
	t.Cleanup(func() {
		_ = ln.Close()
		<-done
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx) // ends its HTTP/2 servers' accept loops
	})
	return ln.Addr().String()
}

// TestPrefaceHandoff: the bytes a dispatcher already read (part of the
// preface, the whole preface, or the preface and frames) are replayed.
func TestPrefaceHandoff(t *testing.T) {
	up := startHTTP(t, true)
	for _, n := range []int{1, 14, 24, 33} {
		addr := handoffProxy(t, &exchange.Service{Name: "s", Upstream: up}, n)
		cl := h2cClient()
		res, err := cl.Get("http://" + addr + "/")
		if err != nil {
			t.Fatalf("handoff of %d bytes: %v", n, err)
		}
		_ = res.Body.Close()
		cl.CloseIdleConnections()
		if res.StatusCode != 200 || res.Header.Get("X-Proto") != "HTTP/2.0" {
			t.Fatalf("handoff of %d bytes: %d %v", n, res.StatusCode, res.Header)
		}
	}
}

// TestBadPrefaceClosesCleanly: a connection that started like the preface
// but is not one ends with a FIN the client can read up to (h2spec 3.5/2),
// not a reset.
func TestBadPrefaceClosesCleanly(t *testing.T) {
	addr := handoffProxy(t, &exchange.Service{Name: "s", Upstream: "127.0.0.1:9"}, 3)
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := io.WriteString(c, "PRI * HTTP/1.1\r\nHost: x\r\n\r\nmore bytes the proxy never reads"); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(30 * time.Second))
	if n, err := c.Read(make([]byte, 1)); err != io.EOF {
		t.Fatalf("read %d, %v; want EOF", n, err)
	}
}
