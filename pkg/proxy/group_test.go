package proxy

import (
	"context"
	"errors"
	"fmt"
	"net"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/rl-tproxy/rl-tproxy/internal/testkit"
	"github.com/rl-tproxy/rl-tproxy/pkg/exchange"
)

// acceptSpread dials addr until every listener of lns accepted at least
// once (bounded by max connections) and returns the accepts per listener.
// It accepts on each socket itself, so it measures the kernel's reuseport
// selection.
func acceptSpread(t *testing.T, lns []net.Listener, max int) []int {
	t.Helper()
	counts := make([]int, len(lns))
	accepted := make(chan int, len(lns))
	for i, ln := range lns {
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				c.Close()
				accepted <- i
			}
		}()
	}
	addr := lns[0].Addr().String()
	for n := 0; n < max; n++ {
		c, err := net.DialTimeout("tcp", addr, 10*time.Second)
		if err != nil {
			t.Fatalf("dial %s: %v", addr, err)
		}
		c.Close()
		select {
		case i := <-accepted:
			counts[i]++
		case <-time.After(10 * time.Second):
			t.Fatalf("connection %d not accepted by any socket of the group", n)
		}
		all := true
		for _, k := range counts {
			all = all && k > 0
		}
		if all {
			break
		}
	}
	return counts
}

func TestListenGroup(t *testing.T) {
	for _, tc := range []struct {
		addr string
		n    int
	}{
		{"127.0.0.1:0", 4},
		{"[::1]:0", 3},
		{"127.0.0.1:0", 1},
	} {
		t.Run(tc.addr, func(t *testing.T) {
			lns, err := ListenGroup(context.Background(), tc.addr, tc.n)
			if err != nil {
				if tc.addr[0] == '[' {
					testkit.Missing(t, "needs IPv6 loopback: %v", err)
				}
				t.Fatal(err)
			}
			defer closeListeners(lns)
			if len(lns) != tc.n {
				t.Fatalf("%d sockets, want %d", len(lns), tc.n)
			}
			for _, ln := range lns {
				if ln.Addr().String() != lns[0].Addr().String() {
					t.Fatalf("group sockets on %v and %v", ln.Addr(), lns[0].Addr())
				}
				fd := listenerFD(t, ln)
				if v, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_REUSEPORT); err != nil || v != 1 {
					t.Fatalf("SO_REUSEPORT %d %v", v, err)
				}
				if p, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_PROTOCOL); err != nil || p != unix.IPPROTO_TCP {
					t.Fatalf("protocol %d %v, want plain TCP (no MPTCP)", p, err)
				}
			}
			// The kernel spreads connections across every socket.
			counts := acceptSpread(t, lns, 400)
			for i, k := range counts {
				if k == 0 {
					t.Fatalf("socket %d of %d accepted nothing in 400 connections: %v", i, len(lns), counts)
				}
			}
			t.Logf("accepts per socket: %v", counts)
		})
	}
}

func TestListenGroupDefaultsAndErrors(t *testing.T) {
	lns, err := ListenGroup(context.Background(), "127.0.0.1:0", 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(lns) != runtime.GOMAXPROCS(0) {
		t.Errorf("n=0: %d sockets, want GOMAXPROCS %d", len(lns), runtime.GOMAXPROCS(0))
	}
	// A port-0 group is new: a second group never joins the first.
	other, err := ListenGroup(context.Background(), "127.0.0.1:0", 2)
	if err != nil {
		t.Fatal(err)
	}
	if other[0].Addr().String() == lns[0].Addr().String() {
		t.Errorf("second port-0 group got the first group's address %v", lns[0].Addr())
	}
	closeListeners(other)

	// An address held by a socket without SO_REUSEPORT: the first bind
	// fails, nothing stays open.
	plain, err := Listen(context.Background(), "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close()
	if g, err := ListenGroup(context.Background(), plain.Addr().String(), 2); err == nil {
		closeListeners(g)
		t.Fatalf("joined a plain listener's address")
	}
	// A fixed address another group holds (a second proxy on the same
	// listen address) is refused, not joined.
	held, err := ListenGroup(context.Background(), "127.0.0.1:0", 2)
	if err != nil {
		t.Fatal(err)
	}
	defer closeListeners(held)
	if g, err := ListenGroup(context.Background(), held[0].Addr().String(), 2); !errors.Is(err, unix.EADDRINUSE) {
		closeListeners(g)
		t.Fatalf("ListenGroup on an address another group holds: %v, want EADDRINUSE", err)
	}
	// Once that group is closed the address is free again.
	addr := held[0].Addr().String()
	closeListeners(held)
	again, err := ListenGroup(context.Background(), addr, 2)
	if err != nil {
		t.Fatalf("ListenGroup on %s after the holder closed: %v", addr, err)
	}
	closeListeners(again)
	// Malformed and foreign addresses fail without leaving sockets open
	// (TestMain checks descriptors).
	for _, bad := range []string{"nohostport", "127.0.0.1:99999", "203.0.113.1:0"} {
		if g, err := ListenGroup(context.Background(), bad, 2); err == nil {
			closeListeners(g)
			t.Errorf("ListenGroup(%q) succeeded", bad)
		}
	}
	closeListeners(lns)
}

func listenerFD(t *testing.T, ln net.Listener) int {
	t.Helper()
	rc, err := ln.(syscall.Conn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var fd int
	if err := rc.Control(func(f uintptr) { fd = int(f) }); err != nil {
		t.Fatal(err)
	}
	return fd
}

// countingListener counts the connections its accept loop took.
type countingListener struct {
	net.Listener
	n atomic.Int64
}

func (l *countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.n.Add(1)
	}
	return c, err
}

// TestServeGroup: the loops accept on every socket of a group (socket i
// on loop i mod loops, or every loop on every socket), so every socket
// serves; Shutdown ends them all with
// ErrClosed, and one socket failing ends the group.
func TestServeGroup(t *testing.T) {
	up := keepAliveUpstream(t, 0)
	svc := &exchange.Service{Name: "web", Upstream: up.addr()}
	p, err := New(Config{Config: exchange.Config{Services: []*exchange.Service{svc}}})
	if err != nil {
		t.Fatal(err)
	}
	raw, err := ListenGroup(context.Background(), "127.0.0.1:0", 4)
	if err != nil {
		t.Fatal(err)
	}
	counting := make([]*countingListener, len(raw))
	lns := make([]net.Listener, len(raw))
	for i, ln := range raw {
		counting[i] = &countingListener{Listener: ln}
		lns[i] = counting[i]
	}
	served := make(chan error, 1)
	go func() { served <- p.ServeGroup(lns, svc) }()
	addr := raw[0].Addr().String()
	every := func() bool {
		for _, l := range counting {
			if l.n.Load() == 0 {
				return false
			}
		}
		return true
	}
	for n := 0; n < 400 && !every(); n++ {
		c := dialClient(t, addr)
		c.send("GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
		if r, _ := c.resp("GET"); r.StatusCode != 200 {
			t.Fatalf("status %d", r.StatusCode)
		}
		c.c.Close()
	}
	if !every() {
		var got []int64
		for _, l := range counting {
			got = append(got, l.n.Load())
		}
		t.Fatalf("accepts per socket after 400 connections: %v; want every socket serving", got)
	}
	if err := p.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := <-served; err != ErrClosed {
		t.Fatalf("ServeGroup after Shutdown: %v, want ErrClosed", err)
	}

	// One socket closed under the group (a failure): the group ends with
	// that error and its other sockets are closed.
	q, err := New(Config{Config: exchange.Config{Services: []*exchange.Service{svc}}})
	if err != nil {
		t.Fatal(err)
	}
	defer q.Shutdown(context.Background())
	g, err := ListenGroup(context.Background(), "127.0.0.1:0", 3)
	if err != nil {
		t.Fatal(err)
	}
	go func() { served <- q.ServeGroup(g, svc) }()
	// Serve one request first so the accept loops run.
	c := dialClient(t, g[0].Addr().String())
	c.send("GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
	if r, _ := c.resp("GET"); r.StatusCode != 200 {
		t.Fatalf("status %d", r.StatusCode)
	}
	g[1].Close()
	err = <-served
	if err == nil || errors.Is(err, ErrClosed) || !errors.Is(err, net.ErrClosed) {
		t.Fatalf("ServeGroup with a socket closed: %v, want that socket's accept error", err)
	}
	if c, err := net.DialTimeout("tcp", g[0].Addr().String(), 10*time.Second); err == nil {
		c.Close()
		t.Fatalf("group still accepts after one socket failed")
	}
	if err := (&Proxy{}).serveGroup(nil, pickByPort); err == nil {
		t.Fatalf("empty group served")
	}
}

// loopHook admits everything and records which loop served each request.
type loopHook struct {
	mu    sync.Mutex
	loops map[int]int
}

func (h *loopHook) Admit(_ context.Context, r *exchange.Request) exchange.Decision {
	h.mu.Lock()
	if r.Loop != nil {
		h.loops[r.Loop.ID()]++
	}
	h.mu.Unlock()
	return exchange.Decision{Allow: true}
}

func (h *loopHook) Done(*exchange.Request, *exchange.Decision, *exchange.Result) {}

// TestServeGroupOnLoops: on the event-loop path a group with a socket per
// loop is served with each loop accepting on its own socket, and a group
// smaller than the loops is shared by every loop; either way every
// request is answered, and Shutdown ends the group with ErrClosed.
func TestServeGroupOnLoops(t *testing.T) {
	up := keepAliveUpstream(t, 0)
	for _, sockets := range []int{2, 4, 1} {
		t.Run(fmt.Sprint(sockets), func(t *testing.T) {
			svc := &exchange.Service{Name: "web", Upstream: up.addr()}
			h := &loopHook{loops: map[int]int{}}
			p, err := New(Config{Config: exchange.Config{Services: []*exchange.Service{svc}, Hook: h}, EventLoops: 2})
			if err != nil {
				t.Fatal(err)
			}
			lns, err := ListenGroup(context.Background(), "127.0.0.1:0", sockets)
			if err != nil {
				t.Fatal(err)
			}
			served := make(chan error, 1)
			go func() { served <- p.ServeGroup(lns, svc) }()
			for range 64 {
				c := dialClient(t, lns[0].Addr().String())
				c.send("GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
				if r, _ := c.resp("GET"); r.StatusCode != 200 {
					t.Fatalf("status %d", r.StatusCode)
				}
				c.c.Close()
			}
			h.mu.Lock()
			t.Logf("requests per loop: %v", h.loops)
			n := 0
			for _, k := range h.loops {
				n += k
			}
			h.mu.Unlock()
			if n != 64 {
				t.Fatalf("%d requests reached the hook from a loop, want 64", n)
			}
			if err := p.Shutdown(context.Background()); err != nil {
				t.Fatal(err)
			}
			if err := <-served; err != ErrClosed {
				t.Fatalf("ServeGroup after Shutdown: %v, want ErrClosed", err)
			}
		})
	}
}

// TestServeReturnsOnAnnouncedClose: a listener from Listen or ListenGroup
// announces its Close, so Serve on the loops returns when the caller
// closes it (a reload dropping an address) without polling: the poll
// interval is an hour here. A plain net.Listen listener still ends Serve
// through the poll. After Serve returned, the address refuses
// connections: the loops' duplicate is closed too.
func TestServeReturnsOnAnnouncedClose(t *testing.T) {
	up := keepAliveUpstream(t, 0)
	listenOne := func(ctx context.Context, addr string) ([]net.Listener, error) {
		ln, err := Listen(ctx, addr)
		return []net.Listener{ln}, err
	}
	plain := func(ctx context.Context, addr string) ([]net.Listener, error) {
		var lc net.ListenConfig
		ln, err := lc.Listen(ctx, "tcp", addr)
		return []net.Listener{ln}, err
	}
	group := func(ctx context.Context, addr string) ([]net.Listener, error) { return ListenGroup(ctx, addr, 2) }
	for _, tc := range []struct {
		name   string
		listen func(context.Context, string) ([]net.Listener, error)
		poll   time.Duration
	}{
		{"Listen", listenOne, time.Hour},
		{"ListenGroup", group, time.Hour},
		{"net.Listen polled", plain, time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			old := closedPoll
			closedPoll = tc.poll
			t.Cleanup(func() { closedPoll = old })
			svc := &exchange.Service{Name: "web", Upstream: up.addr()}
			p, err := New(Config{Config: exchange.Config{Services: []*exchange.Service{svc}}, EventLoops: 2})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				p.Shutdown(ctx)
			})
			lns, err := tc.listen(context.Background(), "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			addr := lns[0].Addr().String()
			served := make(chan error, 1)
			go func() { served <- p.ServeGroup(lns, svc) }()
			c := dialClient(t, addr)
			c.send("GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
			if r, _ := c.resp("GET"); r.StatusCode != 200 {
				t.Fatalf("status %d", r.StatusCode)
			}
			c.c.Close()
			closeListeners(lns)
			select {
			case err := <-served:
				if !errors.Is(err, net.ErrClosed) {
					t.Fatalf("ServeGroup after the listeners closed: %v, want net.ErrClosed", err)
				}
			case <-time.After(30 * time.Second):
				t.Fatal("ServeGroup still running 30 s after its listeners closed")
			}
			if c, err := net.DialTimeout("tcp", addr, 10*time.Second); err == nil {
				c.Close()
				t.Fatalf("%s still accepts connections after Serve returned", addr)
			}
		})
	}
}
