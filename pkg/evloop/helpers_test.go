package evloop

import (
	"bytes"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/rl-tproxy/rl-tproxy/internal/testkit"
	"golang.org/x/sys/unix"
)

// eachBackend runs fn as a subtest per backend; every behaviour test
// runs over both.
func eachBackend(t *testing.T, fn func(t *testing.T, be Backend)) {
	for _, be := range []Backend{Epoll, IOUring} {
		t.Run(be.String(), func(t *testing.T) {
			if be == IOUring {
				if err := probeUring(); err != nil {
					testkit.Missing(t, "io_uring refused on this machine: %v", err)
				}
			}
			fn(t, be)
		})
	}
}

func quietLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func startGroup(t testing.TB, be Backend, loops int) *Group {
	t.Helper()
	g, err := Start(Config{Loops: loops, Backend: be, Logger: quietLogger(), BufSize: 4096})
	if err != nil {
		t.Fatalf("start %s: %v", be, err)
	}
	if g.Backend() != be {
		t.Fatalf("backend %s running, want %s", g.Backend(), be)
	}
	t.Cleanup(func() {
		if err := g.Close(); err != nil {
			t.Errorf("close group: %v", err)
		}
	})
	return g
}

// on runs fn on l's thread and waits for it.
func on(l *Loop, fn func()) {
	done := make(chan struct{})
	l.Post(func() { fn(); close(done) })
	<-done
}

// listenFD is a non-blocking loopback listener; it closes with the test.
func listenFD(t testing.TB) (int, string) {
	t.Helper()
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	if err := unix.Bind(fd, &unix.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatal(err)
	}
	if err := unix.Listen(fd, 1024); err != nil {
		t.Fatal(err)
	}
	sa, err := unix.Getsockname(fd)
	if err != nil {
		t.Fatal(err)
	}
	a := sa.(*unix.SockaddrInet4)
	return fd, (&net.TCPAddr{IP: net.IP(a.Addr[:]), Port: a.Port}).String()
}

// acceptFunc adapts a function to AcceptHandler.
type acceptFunc func(l *Loop, fd int, remote netip.AddrPort)

func (f acceptFunc) OnAccept(l *Loop, fd int, remote netip.AddrPort) { f(l, fd, remote) }

// listenAll makes every loop of g accept on fd and Add what it accepts
// with the handler newH returns.
func listenAll(t testing.TB, g *Group, fd int, newH func() Handler) {
	t.Helper()
	for _, l := range g.Loops() {
		var err error
		on(l, func() {
			err = l.Listen(fd, acceptFunc(func(l *Loop, cfd int, _ netip.AddrPort) {
				if _, err := l.Add(cfd, newH()); err != nil {
					unix.Close(cfd)
				}
			}))
		})
		if err != nil {
			t.Fatal(err)
		}
	}
}

// echo writes back what it reads, closes after the peer's EOF once its
// queue drained, and applies backpressure above limit queued bytes.
type echo struct {
	limit  int
	eof    bool
	mu     sync.Mutex
	events []string
}

func (e *echo) log(ev string) {
	e.mu.Lock()
	e.events = append(e.events, ev)
	e.mu.Unlock()
}

func (e *echo) OnConnect(*Sock, error) {}

func (e *echo) OnRead(s *Sock, b []byte) {
	s.Write(b)
	if e.limit > 0 && s.Pending() > e.limit {
		s.PauseRead()
	}
}

func (e *echo) OnEOF(s *Sock) {
	e.eof = true
	e.log("eof")
	if s.Pending() == 0 {
		s.Close()
	}
}

func (e *echo) OnError(_ *Sock, err error) { e.log("error: " + err.Error()) }

func (e *echo) OnDrained(s *Sock) {
	if e.eof {
		s.Close()
		return
	}
	s.ResumeRead()
}

// roundTrip sends data on c, half-closes, and checks it all comes back.
func roundTrip(t testing.TB, c net.Conn, data []byte) error {
	errc := make(chan error, 1)
	go func() {
		_, err := c.Write(data)
		if err == nil {
			err = c.(*net.TCPConn).CloseWrite()
		}
		errc <- err
	}()
	got, err := io.ReadAll(c)
	if werr := <-errc; werr != nil {
		return werr
	}
	if err != nil {
		return err
	}
	if !bytes.Equal(got, data) {
		return errors.New("echoed bytes differ from the sent ones")
	}
	return nil
}

func dial(t testing.TB, addr string) net.Conn {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	c.SetDeadline(time.Now().Add(testkit.WaitBound)) // a hang fails, bounded
	return c
}

func waitStats(t testing.TB, g *Group, what string, cond func(Stats) bool) {
	t.Helper()
	testkit.WaitFor(t, what, func() bool { return cond(g.Stats()) })
}

// splitAddr parses an IPv4 "host:port".
func splitAddr(t testing.TB, addr string) ([4]byte, int) {
	t.Helper()
	a, err := net.ResolveTCPAddr("tcp4", addr)
	if err != nil {
		t.Fatal(err)
	}
	return [4]byte(a.IP.To4()), a.Port
}

// rawClient is a blocking loopback connection driven with plain system
// calls, so the client side allocates nothing either.
func rawClient(t testing.TB, addr string) int {
	t.Helper()
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	host, port := splitAddr(t, addr)
	if err := unix.Connect(fd, &unix.SockaddrInet4{Addr: host, Port: port}); err != nil {
		t.Fatal(err)
	}
	unix.SetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_NODELAY, 1)
	return fd
}
