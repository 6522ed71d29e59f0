package h1client_test

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/rl-tproxy/rl-tproxy/pkg/h1client"
)

// upstream is a raw TCP upstream on loopback: each accepted connection
// runs serve with its index.
type upstream struct {
	addr string

	mu    sync.Mutex
	conns int
	// closed receives a connection's index when serveEach saw the client
	// close it.
	closed chan int
}

func newUpstream() *upstream { return &upstream{closed: make(chan int, 1024)} }

// startUpstream is newUpstream().start(t, serve).
func startUpstream(t testing.TB, serve func(i int, c net.Conn, br *bufio.Reader)) *upstream {
	return newUpstream().start(t, serve)
}

// start listens on loopback and serves each connection with serve until
// the test ends.
func (u *upstream) start(t testing.TB, serve func(i int, c net.Conn, br *bufio.Reader)) *upstream {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	u.addr = ln.Addr().String()
	var wg sync.WaitGroup
	var open sync.Map
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			u.mu.Lock()
			i := u.conns
			u.conns++
			u.mu.Unlock()
			open.Store(c, true)
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer open.Delete(c)
				defer c.Close()
				serve(i, c, bufio.NewReader(c))
			}()
		}
	}()
	t.Cleanup(func() {
		_ = ln.Close()
		open.Range(func(k, _ any) bool { _ = k.(net.Conn).Close(); return true })
		wg.Wait()
	})
	return u
}

func (u *upstream) connCount() int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.conns
}

// serveEach answers every request of a connection with answer's bytes
// until the client closes it, then reports the close on u.closed.
func (u *upstream) serveEach(answer func(i int, req *http.Request, body []byte) string) func(int, net.Conn, *bufio.Reader) {
	return func(i int, c net.Conn, br *bufio.Reader) {
		for {
			req, err := http.ReadRequest(br)
			if err != nil {
				u.closed <- i
				return
			}
			body, err := io.ReadAll(req.Body)
			if err != nil {
				u.closed <- i
				return
			}
			if _, err := io.WriteString(c, answer(i, req, body)); err != nil {
				u.closed <- i
				return
			}
		}
	}
}

// waitClosed waits until the client closed upstream connection i.
func (u *upstream) waitClosed(t *testing.T, i int) {
	t.Helper()
	bound := time.NewTimer(10 * time.Second) // a failure bound
	defer bound.Stop()
	for {
		select {
		case j := <-u.closed:
			if j == i {
				return
			}
		case <-bound.C:
			t.Fatalf("upstream connection %d still open after 10s", i)
		}
	}
}

// newPool is a pool to addr with cfg's bounds (MaxIdle 4 when unset),
// closed at cleanup.
func newPool(t testing.TB, addr string, cfg h1client.Config) *h1client.Pool {
	cfg.Addr = addr
	if cfg.MaxIdle == 0 {
		cfg.MaxIdle = 4
	}
	p := h1client.New(cfg)
	t.Cleanup(p.CloseIdleConnections)
	return p
}

// get sends a body-less request and reads the whole response.
func get(t *testing.T, p *h1client.Pool, method, path string) (*http.Response, string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second) // a failure bound
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, method, "http://upstream.test"+path, nil)
	res, err := p.RoundTrip(req)
	if err != nil {
		return nil, "", err
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	return res, string(b), err
}

func okResponse(body string) string {
	return "HTTP/1.1 200 OK\r\nContent-Length: " + strconv.Itoa(len(body)) + "\r\n\r\n" + body
}
