package main

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/rl-tproxy/rl-tproxy/internal/testkit"
)

// The prototype's numbers in docs/bench/evloop.md are only worth something
// if it relays correctly: every test below runs against both syscall
// layers.

var body = strings.Repeat("x", 612)

func backend(t *testing.T) netip.AddrPort {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Got-XFF", r.Header.Get("X-Forwarded-For"))
		io.WriteString(w, body)
	}))
	t.Cleanup(srv.Close)
	return netip.MustParseAddrPort(strings.TrimPrefix(srv.URL, "http://"))
}

func freeAddr(t *testing.T) netip.AddrPort {
	t.Helper()
	return netip.MustParseAddrPort(testkit.FreeAddr(t))
}

// start runs one loop of mode in front of a fresh backend; the loop's
// goroutine lives until the test binary exits (the prototype has no stop).
func start(t *testing.T, mode string) netip.AddrPort {
	t.Helper()
	up, la := backend(t), freeAddr(t)
	switch mode {
	case "epoll":
		l, err := newLoop(0, la, up)
		if err != nil {
			t.Fatal(err)
		}
		go l.run()
	case "uring":
		ready := make(chan error, 1)
		go runUring(la, up, ready)
		if err := <-ready; err != nil {
			if errors.Is(err, unix.EPERM) || errors.Is(err, unix.ENOSYS) || errors.Is(err, unix.EINVAL) {
				testkit.Missing(t, "io_uring refused by the kernel or seccomp: %v", err)
			}
			t.Fatal(err)
		}
	}
	return la
}

func get(t *testing.T, r *bufio.Reader) {
	t.Helper()
	resp, err := http.ReadResponse(r, nil)
	if err != nil {
		t.Fatalf("read response: %v", err)
	}
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil || string(b) != body || resp.StatusCode != 200 {
		t.Fatalf("response %d, %d body bytes, err %v", resp.StatusCode, len(b), err)
	}
	if xff := resp.Header.Get("X-Got-XFF"); xff != "127.0.0.1" {
		t.Fatalf("backend saw X-Forwarded-For %q", xff)
	}
}

func TestRelay(t *testing.T) {
	for _, tc := range []struct {
		mode   string
		strict bool
	}{{"epoll", false}, {"epoll", true}, {"uring", false}, {"uring", true}} {
		name := tc.mode
		if tc.strict {
			name += "-strict"
		}
		t.Run(name, func(t *testing.T) {
			strictParse = tc.strict
			addr := start(t, tc.mode)
			strictParse = false
			const req = "GET / HTTP/1.1\r\nHost: bench\r\n\r\n"
			t.Run("keep-alive", func(t *testing.T) {
				c, err := net.Dial("tcp", addr.String())
				if err != nil {
					t.Fatal(err)
				}
				defer c.Close()
				c.SetDeadline(time.Now().Add(30 * time.Second))
				r := bufio.NewReader(c)
				for i := 0; i < 200; i++ {
					if _, err := io.WriteString(c, req); err != nil {
						t.Fatal(err)
					}
					get(t, r)
				}
			})
			t.Run("pipelined", func(t *testing.T) {
				c, err := net.Dial("tcp", addr.String())
				if err != nil {
					t.Fatal(err)
				}
				defer c.Close()
				c.SetDeadline(time.Now().Add(30 * time.Second))
				if _, err := io.WriteString(c, strings.Repeat(req, 5)); err != nil {
					t.Fatal(err)
				}
				r := bufio.NewReader(c)
				for i := 0; i < 5; i++ {
					get(t, r)
				}
			})
			t.Run("split-head", func(t *testing.T) {
				c, err := net.Dial("tcp", addr.String())
				if err != nil {
					t.Fatal(err)
				}
				defer c.Close()
				c.SetDeadline(time.Now().Add(30 * time.Second))
				r := bufio.NewReader(c)
				for _, part := range []string{"GET / HT", "TP/1.1\r\nHost: b", "ench\r\n\r\n"} {
					if _, err := io.WriteString(c, part); err != nil {
						t.Fatal(err)
					}
					time.Sleep(10 * time.Millisecond) // separate segments; not synchronisation
				}
				get(t, r)
			})
			t.Run("smuggling-shape", func(t *testing.T) {
				if !tc.strict {
					return // only -strict parses the head
				}
				c, err := net.Dial("tcp", addr.String())
				if err != nil {
					t.Fatal(err)
				}
				defer c.Close()
				c.SetDeadline(time.Now().Add(30 * time.Second))
				io.WriteString(c, "GET / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n")
				if n, err := c.Read(make([]byte, 1)); err == nil {
					t.Fatalf("strict loop relayed a Content-Length + chunked request (%d bytes back)", n)
				}
			})
			t.Run("concurrent", func(t *testing.T) {
				var wg sync.WaitGroup
				errc := make(chan error, 16)
				for g := 0; g < 16; g++ {
					wg.Add(1)
					go func() {
						defer wg.Done()
						errc <- clientRun(addr.String(), req, 50)
					}()
				}
				wg.Wait()
				close(errc)
				for err := range errc {
					if err != nil {
						t.Fatal(err)
					}
				}
			})
		})
	}
}

func clientRun(addr, req string, n int) error {
	c, err := net.Dial("tcp", addr)
	if err != nil {
		return err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(30 * time.Second))
	r := bufio.NewReader(c)
	for i := 0; i < n; i++ {
		if _, err := io.WriteString(c, req); err != nil {
			return err
		}
		resp, err := http.ReadResponse(r, nil)
		if err != nil {
			return fmt.Errorf("request %d: %w", i, err)
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || string(b) != body {
			return fmt.Errorf("request %d: %d body bytes, %v", i, len(b), err)
		}
	}
	return nil
}
