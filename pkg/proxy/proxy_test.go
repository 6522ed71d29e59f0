package proxy

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"net/netip"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/rl-tproxy/rl-tproxy/pkg/exchange"
)

func TestListenIsPlainTCP(t *testing.T) {
	ln, err := Listen(context.Background(), "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	raw, err := ln.(syscall.Conn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var proto int
	var serr error
	if err := raw.Control(func(fd uintptr) {
		proto, serr = unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_PROTOCOL)
	}); err != nil {
		t.Fatal(err)
	}
	if serr != nil {
		t.Fatal(serr)
	}
	if proto != unix.IPPROTO_TCP {
		t.Fatalf("SO_PROTOCOL = %d, want IPPROTO_TCP (%d): MPTCP listeners cannot enter a sockmap", proto, unix.IPPROTO_TCP)
	}
}

func TestNoGoroutineLeak(t *testing.T) {
	base := numGoroutines()
	func() {
		up := newRawUpstream(t, func(_ int, c net.Conn) {
			br := bufio.NewReader(c)
			readRequestHead(br)
			io.Copy(io.Discard, br)
		})
		hook := newTestHook(func(ctx context.Context, r *exchange.Request) exchange.Decision {
			return exchange.Decision{Allow: true}
		})
		p, err := New(Config{Config: exchange.Config{Services: []*exchange.Service{{Name: "w", Upstream: up.addr()}}, Hook: hook}})
		if err != nil {
			t.Fatal(err)
		}
		ln, _ := Listen(context.Background(), "127.0.0.1:0")
		served := make(chan error, 1)
		go func() { served <- p.Serve(ln, p.Config().Services[0]) }()
		for i := 0; i < 5; i++ {
			c, err := net.Dial("tcp", ln.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			io.WriteString(c, "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\nabc")
			hookWaitAdmit(t, hook, i+1)
			c.Close()
			hook.waitDone(t)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := p.Shutdown(ctx); err != nil {
			t.Fatal(err)
		}
		<-served
		up.ln.Close()
		up.wg.Wait()
	}()
	noLeak(t, base)
}

func numGoroutines() int {
	for i := 0; i < 1000; i++ {
		// let goroutines of earlier tests finish exiting
		runtime.Gosched()
	}
	return runtime.NumGoroutine()
}

func TestTimeouts(t *testing.T) {
	up := keepAliveUpstream(t, 0)
	_, addr := startProxy(t, nil, &exchange.Service{Upstream: up.addr(), HeaderTimeout: 200 * time.Millisecond,
		IdleTimeout: 200 * time.Millisecond}, nil)
	t.Run("header-408", func(t *testing.T) {
		c := dialClient(t, addr)
		c.send("GET / HTTP/1.1\r\nHost: x\r\n")
		r, _ := c.resp("GET")
		if r.StatusCode != 408 || !r.Close {
			t.Fatalf("status %d close %v", r.StatusCode, r.Close)
		}
	})
	t.Run("idle-close", func(t *testing.T) {
		c := dialClient(t, addr)
		c.send("GET / HTTP/1.1\r\nHost: x\r\n\r\n")
		c.resp("GET")
		c.expectClosed() // no bytes, just a close after the idle timeout
	})
}

func TestDrain(t *testing.T) {
	release := make(chan struct{})
	reached := make(chan struct{}, 1)
	up := httpUpstream(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/slow" {
			reached <- struct{}{}
			<-release
		}
		w.Write([]byte("done"))
	}))
	p, err := New(Config{Config: exchange.Config{Services: []*exchange.Service{{Name: "w", Upstream: up}}}})
	if err != nil {
		t.Fatal(err)
	}
	ln, _ := Listen(context.Background(), "127.0.0.1:0")
	served := make(chan error, 1)
	go func() { served <- p.Serve(ln, p.Config().Services[0]) }()
	addr := ln.Addr().String()

	idle := dialClient(t, addr)
	idle.send("GET / HTTP/1.1\r\nHost: x\r\n\r\n")
	idle.resp("GET")
	busy := dialClient(t, addr)
	busy.send("GET /slow HTTP/1.1\r\nHost: x\r\n\r\n")
	<-reached

	shut := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		shut <- p.Shutdown(ctx)
	}()
	idle.expectClosed() // idle keep-alive connections are closed at once
	if err := <-served; err != ErrClosed {
		t.Fatalf("Serve: %v", err)
	}
	if _, err := net.Dial("tcp", addr); err == nil {
		t.Fatal("still accepting after Shutdown")
	}
	close(release)
	r, body := busy.resp("GET")
	if r.StatusCode != 200 || body != "done" || !r.Close {
		t.Fatalf("in-flight: %d %q close=%v", r.StatusCode, body, r.Close)
	}
	if err := <-shut; err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
}

func TestUpdateInFlightKeepsConfig(t *testing.T) {
	upA := newRawUpstream(t, func(_ int, c net.Conn) {
		br := bufio.NewReader(c)
		for {
			if _, err := readRequestHead(br); err != nil {
				return
			}
			io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\nA")
		}
	})
	upB := newRawUpstream(t, func(_ int, c net.Conn) {
		br := bufio.NewReader(c)
		for {
			if _, err := readRequestHead(br); err != nil {
				return
			}
			io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\nB")
		}
	})
	entered := make(chan struct{}, 1)
	release := make(chan struct{})
	hook := newTestHook(func(ctx context.Context, r *exchange.Request) exchange.Decision {
		if string(r.Path) == "/wait" {
			entered <- struct{}{}
			<-release
		}
		return exchange.Decision{Allow: true}
	})
	svcA := &exchange.Service{Name: "web", Upstream: upA.addr()}
	p, addr := startProxy(t, hook, svcA, nil)
	c := dialClient(t, addr)
	c.send("GET /wait HTTP/1.1\r\nHost: x\r\n\r\n")
	<-entered
	if err := p.Update(Config{Config: exchange.Config{Services: []*exchange.Service{{Name: "web", Upstream: upB.addr()}}, Hook: hook}}); err != nil {
		t.Fatal(err)
	}
	close(release)
	if _, body := c.resp("GET"); body != "A" {
		t.Fatalf("in-flight request went to %q, want the old upstream A", body)
	}
	c.send("GET / HTTP/1.1\r\nHost: x\r\n\r\n")
	if _, body := c.resp("GET"); body != "B" {
		t.Fatalf("new request went to %q, want B", body)
	}
}

func TestServeSteeredPicksByPort(t *testing.T) {
	up := keepAliveUpstream(t, 0)
	ln, _ := Listen(context.Background(), "127.0.0.1:0")
	port := uint16(ln.Addr().(*net.TCPAddr).Port)
	p, err := New(Config{
		Config: exchange.Config{
			Services: []*exchange.Service{
				{Name: "other", Port: port + 1, Upstream: "127.0.0.1:1"},
				{Name: "this", Port: port, Upstream: up.addr()},
			},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	go p.ServeSteered(ln, nil)
	defer p.Shutdown(context.Background())
	c := dialClient(t, ln.Addr().String())
	c.send("GET / HTTP/1.1\r\nHost: x\r\n\r\n")
	if r, _ := c.resp("GET"); r.StatusCode != 200 {
		t.Fatalf("status %d", r.StatusCode)
	}
}

func TestConfigValidation(t *testing.T) {
	for _, cfg := range []Config{
		{Config: exchange.Config{Services: []*exchange.Service{{Name: "", Upstream: "127.0.0.1:1"}}}},
		{Config: exchange.Config{Services: []*exchange.Service{{Name: "a", Upstream: "nohostport"}}}},
		{Config: exchange.Config{Services: []*exchange.Service{{Name: "a", Upstream: "127.0.0.1:1"}, {Name: "a", Upstream: "127.0.0.1:2"}}}},
		{Config: exchange.Config{Services: []*exchange.Service{{Name: "a", Upstream: "127.0.0.1:1", Listen: []string{"bad"}}}}},
	} {
		if _, err := New(cfg); err == nil {
			t.Errorf("accepted %+v", cfg.Services)
		}
	}
}

func TestListenAllServeAll(t *testing.T) {
	up := keepAliveUpstream(t, 0)
	p, err := New(Config{
		Config: exchange.Config{
			Services: []*exchange.Service{
				{Name: "a", Listen: []string{"127.0.0.1:0", "127.0.0.1:0"}, Upstream: up.addr()},
				{Name: "steered-only", Port: 1, Upstream: up.addr()},
			},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	bound, err := p.ListenAll(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(bound) != 2 {
		t.Fatalf("bound %d listeners", len(bound))
	}
	// Each address is a reuseport group of one socket per loop (one per
	// CPU by default), all on the port the first one got.
	want := runtime.GOMAXPROCS(0)
	if p.ListenGroupSize() != want {
		t.Fatalf("ListenGroupSize %d, want %d (EventLoops %d)", p.ListenGroupSize(), want, p.Config().EventLoops)
	}
	for _, b := range bound {
		if len(b.Listeners) != want {
			t.Fatalf("group of %d sockets, want %d", len(b.Listeners), want)
		}
		for _, ln := range b.Listeners {
			if ln.Addr().String() != b.Listeners[0].Addr().String() {
				t.Fatalf("group sockets on %v and %v", ln.Addr(), b.Listeners[0].Addr())
			}
		}
	}
	served := make(chan error, 1)
	go func() { served <- p.ServeAll(bound) }()
	for _, b := range bound {
		c := dialClient(t, b.Listeners[0].Addr().String())
		c.send("GET / HTTP/1.1\r\nHost: x\r\n\r\n")
		if r, _ := c.resp("GET"); r.StatusCode != 200 {
			t.Fatalf("status %d", r.StatusCode)
		}
	}
	if err := p.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := <-served; err != nil {
		t.Fatalf("ServeAll after Shutdown: %v", err)
	}
	// A listen error names the service and closes nothing it did not open.
	q, _ := New(Config{Config: exchange.Config{Services: []*exchange.Service{{Name: "bad", Listen: []string{"203.0.113.1:1"}, Upstream: up.addr()}}}})
	if _, err := q.ListenAll(context.Background()); err == nil || !strings.Contains(err.Error(), "service bad") {
		t.Fatalf("ListenAll error %v", err)
	}
}

// shutdownInTakeListener closes the proxy down at the worst moment of
// Serve: after Serve registered the listener, before it took the
// listener's descriptor for the loops.
type shutdownInTakeListener struct {
	*net.TCPListener
	p      *Proxy
	closed chan struct{}
	shut   chan error
	once   sync.Once
}

func (l *shutdownInTakeListener) Close() error {
	l.once.Do(func() { close(l.closed) })
	return l.TCPListener.Close()
}

func (l *shutdownInTakeListener) SyscallConn() (syscall.RawConn, error) {
	go func() { l.shut <- l.p.Shutdown(context.Background()) }()
	<-l.closed
	return l.TCPListener.SyscallConn()
}

// TestServeRacingShutdown: a Serve that Shutdown overtakes returns
// ErrClosed, as every other Serve ended by Shutdown does (it returned
// "raw-control ...: use of closed network connection" when Shutdown
// closed the listener before Serve took its descriptor).
func TestServeRacingShutdown(t *testing.T) {
	p, err := New(Config{Config: exchange.Config{Services: []*exchange.Service{{Name: "web", Upstream: "127.0.0.1:1"}}}})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.ListenTCP("tcp", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	l := &shutdownInTakeListener{TCPListener: ln, p: p, closed: make(chan struct{}), shut: make(chan error, 1)}
	if err := p.Serve(l, p.cfg.Load().Services[0]); err != ErrClosed {
		t.Errorf("Serve returned %v, want ErrClosed", err)
	}
	if err := <-l.shut; err != nil {
		t.Errorf("Shutdown: %v", err)
	}
}

// TestDialPrepSetsDialAddrs: with DialPrep the paths outside the loops
// dial addresses, as the loops connect to them (exchange.Config.DialAddrs).
func TestDialPrepSetsDialAddrs(t *testing.T) {
	prep := func(int, netip.AddrPort) (func(), error) { return nil, nil }
	for _, tc := range []struct {
		prep bool
		want bool
	}{{false, false}, {true, true}} {
		cfg := Config{}
		if tc.prep {
			cfg.DialPrep = prep
		}
		p, err := New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		if got := p.Config().DialAddrs; got != tc.want {
			t.Errorf("DialPrep set %v: New's DialAddrs %v, want %v", tc.prep, got, tc.want)
		}
		if err := p.Update(cfg); err != nil {
			t.Fatal(err)
		}
		if got := p.Config().DialAddrs; got != tc.want {
			t.Errorf("DialPrep set %v: Update's DialAddrs %v, want %v", tc.prep, got, tc.want)
		}
		p.Shutdown(t.Context())
	}
}
