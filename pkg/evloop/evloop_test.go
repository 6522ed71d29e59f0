package evloop

import (
	"bytes"
	"crypto/rand"
	"fmt"
	"io"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rl-tproxy/rl-tproxy/internal/testkit"
	"golang.org/x/sys/unix"
)

func TestMain(m *testing.M) { testkit.VerifyMain(m) }

func TestBackendString(t *testing.T) {
	for b, want := range map[Backend]string{Auto: "auto", IOUring: "io_uring", Epoll: "epoll", 9: "Backend(9)"} {
		if b.String() != want {
			t.Errorf("%d: %q, want %q", b, b.String(), want)
		}
	}
	if _, err := Start(Config{Backend: 9}); err == nil {
		t.Error("Start accepted an unknown backend")
	}
}

func TestParseBackend(t *testing.T) {
	for in, want := range map[string]Backend{"auto": Auto, "io_uring": IOUring, "uring": IOUring, "epoll": Epoll} {
		if got, err := ParseBackend(in); err != nil || got != want {
			t.Errorf("ParseBackend(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, in := range []string{"", "EPOLL", "kqueue", "io_uring "} {
		if _, err := ParseBackend(in); err == nil {
			t.Errorf("ParseBackend(%q) accepted it", in)
		}
	}
	for _, b := range []Backend{Auto, IOUring, Epoll} { // String and ParseBackend agree
		if got, err := ParseBackend(b.String()); err != nil || got != b {
			t.Errorf("ParseBackend(%q) = %v, %v", b.String(), got, err)
		}
	}
}

// TestEcho: many clients at once, each a round trip larger than the
// buffers, through real loopback TCP and two loops sharing one listener.
func TestEcho(t *testing.T) {
	eachBackend(t, func(t *testing.T, be Backend) {
		g := startGroup(t, be, 2)
		fd, addr := listenFD(t)
		listenAll(t, g, fd, func() Handler { return &echo{limit: 64 << 10} })
		var wg sync.WaitGroup
		errs := make(chan error, 64)
		for i := 0; i < 64; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				data := make([]byte, 1+i*4099)
				rand.Read(data)
				c := dial(t, addr)
				if err := roundTrip(t, c, data); err != nil {
					errs <- fmt.Errorf("client %d: %w", i, err)
				}
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Error(err)
		}
		waitStats(t, g, "every socket closed and no buffer held", func(s Stats) bool { return s.Sockets == 0 && s.Buffers == 0 })
	})
}

// relay pipes a client socket and an upstream socket both ways, with
// backpressure: a side whose peer has too much queued stops reading.
type relay struct {
	peer   *Sock
	self   *Sock
	client *Sock // set on the upstream half: the client to connect for
	limit  int
	eof    bool
}

func (r *relay) OnConnect(s *Sock, err error) {
	if err != nil {
		r.client.Close()
		return
	}
	r.client.ResumeRead()
}

func (r *relay) OnRead(s *Sock, b []byte) {
	r.peer.Write(b)
	if r.peer.Pending() > r.limit {
		s.PauseRead()
	}
}

func (r *relay) OnEOF(s *Sock) {
	r.peer.CloseWrite()
	r.eof = true
	r.maybeClose()
}

func (r *relay) peerHalf() *relay { return r.peer.Data().(*relay) }

// maybeClose closes both halves once both directions ended and every
// queued byte went out (Close drops queued bytes).
func (r *relay) maybeClose() {
	if r.eof && r.peerHalf().eof && r.self.Pending() == 0 && r.peer.Pending() == 0 {
		r.self.Close()
		r.peer.Close()
	}
}

func (r *relay) OnError(s *Sock, err error) { r.peer.Close() }

func (r *relay) OnDrained(s *Sock) {
	r.peer.ResumeRead()
	r.maybeClose()
}

// TestRelay: client -> loop -> Go echo backend -> loop -> client, with
// Connect, CloseWrite propagation and backpressure on both halves.
func TestRelay(t *testing.T) {
	backend, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer backend.Close()
	go func() {
		for {
			c, err := backend.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				io.Copy(c, c)
				c.(*net.TCPConn).CloseWrite()
			}()
		}
	}()
	port := backend.Addr().(*net.TCPAddr).Port
	eachBackend(t, func(t *testing.T, be Backend) {
		g := startGroup(t, be, 2)
		fd, addr := listenFD(t)
		for _, l := range g.Loops() {
			bsa := &unix.SockaddrInet4{Port: port, Addr: [4]byte{127, 0, 0, 1}} // one per loop: Connect writes into it
			on(l, func() {
				l.Listen(fd, acceptFunc(func(l *Loop, cfd int, _ netip.AddrPort) {
					ufd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
					if err != nil {
						unix.Close(cfd)
						return
					}
					ch, uh := &relay{limit: 32 << 10}, &relay{limit: 32 << 10}
					c, err := l.Add(cfd, ch)
					if err != nil {
						unix.Close(cfd)
						unix.Close(ufd)
						return
					}
					c.PauseRead() // until the upstream is connected
					uh.client = c
					u, err := l.Connect(ufd, bsa, uh)
					if err != nil {
						unix.Close(ufd)
						c.Close()
						return
					}
					ch.peer, ch.self, uh.peer, uh.self = u, c, c, u
					c.SetData(ch)
					u.SetData(uh)
				}))
			})
		}
		var wg sync.WaitGroup
		for i := 0; i < 8; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				data := make([]byte, 1<<20+i)
				rand.Read(data)
				if err := roundTrip(t, dial(t, addr), data); err != nil {
					t.Errorf("client %d: %v", i, err)
				}
			}()
		}
		wg.Wait()
		waitStats(t, g, "relay sockets closed", func(s Stats) bool { return s.Sockets == 0 && s.Buffers == 0 })
	})
}

func TestConnectRefused(t *testing.T) {
	eachBackend(t, func(t *testing.T, be Backend) {
		g := startGroup(t, be, 1)
		l := g.Loops()[0]
		// A port nobody listens on: a listener bound and closed at once.
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		port := ln.Addr().(*net.TCPAddr).Port
		ln.Close()
		got := make(chan error, 1)
		h := &funcHandler{connect: func(s *Sock, err error) { got <- err }}
		on(l, func() {
			fd, _ := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
			if _, err := l.Connect(fd, &unix.SockaddrInet4{Port: port, Addr: [4]byte{127, 0, 0, 1}}, h); err != nil {
				unix.Close(fd)
				got <- err
			}
		})
		if err := <-got; err == nil || !errorsIs(err, unix.ECONNREFUSED) {
			t.Fatalf("connect to a closed port: %v, want ECONNREFUSED", err)
		}
		waitStats(t, g, "failed connect released", func(s Stats) bool { return s.Sockets == 0 })
	})
}

// funcHandler is a Handler made of optional functions.
type funcHandler struct {
	connect func(*Sock, error)
	read    func(*Sock, []byte)
	eof     func(*Sock)
	fail    func(*Sock, error)
	drained func(*Sock)
}

func (h *funcHandler) OnConnect(s *Sock, err error) {
	if h.connect != nil {
		h.connect(s, err)
	}
}

func (h *funcHandler) OnRead(s *Sock, b []byte) {
	if h.read != nil {
		h.read(s, b)
	}
}

func (h *funcHandler) OnEOF(s *Sock) {
	if h.eof != nil {
		h.eof(s)
	}
}

func (h *funcHandler) OnError(s *Sock, err error) {
	if h.fail != nil {
		h.fail(s, err)
	}
}

func (h *funcHandler) OnDrained(s *Sock) {
	if h.drained != nil {
		h.drained(s)
	}
}

// accepted Listens on a fresh listener on loop 0 of g and returns the
// sockets it Adds with h, and a dialled client for each.
func accepted(t testing.TB, g *Group, h func() Handler) (string, <-chan *Sock) {
	t.Helper()
	fd, addr := listenFD(t)
	socks := make(chan *Sock, 1024)
	l := g.Loops()[0]
	on(l, func() {
		if err := l.Listen(fd, acceptFunc(func(l *Loop, cfd int, _ netip.AddrPort) {
			s, err := l.Add(cfd, h())
			if err != nil {
				unix.Close(cfd)
				return
			}
			select {
			case socks <- s:
			default: // nobody takes them (never block the loop)
			}
		})); err != nil {
			t.Error(err)
		}
	})
	return addr, socks
}

func TestPost(t *testing.T) {
	eachBackend(t, func(t *testing.T, be Backend) {
		g := startGroup(t, be, 2)
		const goroutines, each = 8, 500
		var wg sync.WaitGroup
		counts := make([]int, 2) // touched only on the loops' threads
		for i := 0; i < goroutines; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for j := 0; j < each; j++ {
					k := (i + j) % 2
					g.Loops()[k].Post(func() { counts[k]++ })
				}
			}()
		}
		wg.Wait()
		var total int
		for k, l := range g.Loops() {
			on(l, func() { total += counts[k] })
		}
		if total != goroutines*each {
			t.Fatalf("ran %d posted functions, want %d", total, goroutines*each)
		}
	})
}

// TestTimePerTurn: Time is read once per turn (the same value for every
// call in a turn) and read again in the next turn.
func TestTimePerTurn(t *testing.T) {
	eachBackend(t, func(t *testing.T, be Backend) {
		g := startGroup(t, be, 1)
		l := g.Loops()[0]
		var first, again, next time.Time
		on(l, func() { first = l.Time(); again = l.Time() })
		on(l, func() { next = l.Time() })
		if !again.Equal(first) {
			t.Fatalf("two calls in one turn: %v then %v", first, again)
		}
		if !next.After(first) {
			t.Fatalf("the next turn's Time %v is not after the first's %v", next, first)
		}
		if d := time.Since(next); d < 0 {
			t.Fatalf("Time is %v in the future", -d)
		}
	})
}

func TestTimers(t *testing.T) {
	eachBackend(t, func(t *testing.T, be Backend) {
		g := startGroup(t, be, 1)
		l := g.Loops()[0]
		var mu sync.Mutex
		var fired []int
		ts := make([]Timer, 8)
		on(l, func() {
			now := l.Now()
			for i := range ts {
				ts[i].Init(l, func() {
					mu.Lock()
					fired = append(fired, i)
					mu.Unlock()
				})
				// Deadlines in reverse index order, 1-8 ms ahead.
				ts[i].Reset(now + int64(len(ts)-i)*int64(time.Millisecond))
			}
			ts[3].Stop()
			ts[5].Reset(now + 20*int64(time.Millisecond)) // moved last
			ts[6].Stop()
			ts[6].Stop()
			if ts[6].Armed() || !ts[0].Armed() {
				t.Error("Armed is wrong")
			}
		})
		want := []int{7, 4, 2, 1, 0, 5}
		testkit.WaitFor(t, "timers fired", func() bool {
			mu.Lock()
			defer mu.Unlock()
			return len(fired) >= len(want)
		})
		// Nothing else may fire: one more timer after all of them proves
		// the stopped ones stayed stopped.
		var last Timer
		done := make(chan struct{})
		on(l, func() {
			last.Init(l, func() { close(done) })
			last.Reset(l.Now() + 30*int64(time.Millisecond))
		})
		<-done
		mu.Lock()
		defer mu.Unlock()
		if fmt.Sprint(fired) != fmt.Sprint(want) {
			t.Fatalf("fired %v, want %v", fired, want)
		}
	})
}

func TestOnTurnEndAndNow(t *testing.T) {
	eachBackend(t, func(t *testing.T, be Backend) {
		g := startGroup(t, be, 1)
		l := g.Loops()[0]
		var turns atomic.Int64
		var prev int64
		monotonic := true
		on(l, func() {
			l.OnTurnEnd(func() {
				if l.Now() < prev {
					monotonic = false
				}
				prev = l.Now()
				turns.Add(1)
			})
		})
		for i := 0; i < 10; i++ {
			on(l, func() {})
		}
		testkit.WaitFor(t, "turn ends", func() bool { return turns.Load() >= 10 })
		on(l, func() {
			if !monotonic {
				t.Error("Now went backwards")
			}
		})
	})
}

// TestNowIsFresh: a handler woken after a wait sees the time of the
// wake, not of the turn before the wait.
func TestNowIsFresh(t *testing.T) {
	eachBackend(t, func(t *testing.T, be Backend) {
		g := startGroup(t, be, 1)
		l := g.Loops()[0]
		now := make(chan int64, 1)
		addr, _ := accepted(t, g, func() Handler {
			return &funcHandler{read: func(s *Sock, b []byte) { now <- s.Loop().Now() }}
		})
		c := dial(t, addr)
		on(l, func() {}) // the loop has accepted and waits again
		before := l.clock()
		c.Write([]byte("x"))
		if got := <-now; got < before {
			t.Fatalf("OnRead saw Now %d, before the write it was already %d", got, before)
		}
	})
}

// TestPin: with Pin each loop's thread may run only on its CPU, and
// goroutines started elsewhere keep the process's mask.
func TestPin(t *testing.T) {
	allowed, err := allowedCPUs()
	if err != nil {
		t.Fatal(err)
	}
	g, err := Start(Config{Loops: 3, Backend: Epoll, Pin: true, Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	for i, l := range g.Loops() {
		var got []int
		on(l, func() {
			var set unix.CPUSet
			unix.SchedGetaffinity(0, &set)
			for c := 0; c < len(set)*64; c++ {
				if set.IsSet(c) {
					got = append(got, c)
				}
			}
		})
		if want := allowed[i%len(allowed)]; len(got) != 1 || got[0] != want {
			t.Errorf("loop %d runs on CPUs %v, want [%d]", i, got, want)
		}
	}
}

func errorsIs(err error, target error) bool {
	for err != nil {
		if err == target {
			return true
		}
		u, ok := err.(interface{ Unwrap() error })
		if !ok {
			return false
		}
		err = u.Unwrap()
	}
	return false
}

// readN reads exactly n bytes from c.
func readN(t *testing.T, c net.Conn, n int) []byte {
	t.Helper()
	b := make([]byte, n)
	c.SetReadDeadline(time.Now().Add(testkit.WaitBound))
	if _, err := io.ReadFull(c, b); err != nil {
		t.Fatalf("read %d bytes: %v", n, err)
	}
	return b
}

func TestWatch(t *testing.T) {
	eachBackend(t, func(t *testing.T, be Backend) {
		g := startGroup(t, be, 1)
		l := g.Loops()[0]
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer unix.Close(fd)
		unix.Bind(fd, &unix.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}})
		sa, _ := unix.Getsockname(fd)
		got := make(chan string, 16)
		var w *Watch
		on(l, func() {
			w, err = l.Watch(fd, func() {
				var b [64]byte
				for {
					n, _, err := unix.Recvfrom(fd, b[:], 0)
					if err != nil {
						return
					}
					got <- string(b[:n])
				}
			})
		})
		if err != nil {
			t.Fatal(err)
		}
		c, err := net.Dial("udp", fmt.Sprintf("127.0.0.1:%d", sa.(*unix.SockaddrInet4).Port))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		for _, m := range []string{"one", "two"} {
			c.Write([]byte(m))
			if s := <-got; s != m {
				t.Fatalf("got %q, want %q", s, m)
			}
		}
		on(l, func() { w.Stop(); w.Stop() })
		c.Write([]byte("after stop"))
		// The datagram stays in the socket: the stopped watch did not read it.
		var b [64]byte
		testkit.WaitFor(t, "datagram queued", func() bool {
			n, _, _ := unix.Recvfrom(fd, b[:], unix.MSG_PEEK)
			return n > 0
		})
		if len(got) != 0 {
			t.Fatalf("watch read after Stop: %q", <-got)
		}
	})
}

var _ = bytes.Equal

// TestFamilies: the loop is family-agnostic. An IPv6 echo through a
// loopback listener, and Connect over a Unix stream socket, whose
// non-blocking connect succeeds at once (OnConnect(nil) comes in the
// same turn, after Connect returned).
func TestFamilies(t *testing.T) {
	eachBackend(t, func(t *testing.T, be Backend) {
		g := startGroup(t, be, 1)
		l := g.Loops()[0]
		t.Run("ipv6", func(t *testing.T) {
			ln, err := net.Listen("tcp6", "[::1]:0")
			if err != nil {
				testkit.Missing(t, "no IPv6 loopback: %v", err)
			}
			defer ln.Close()
			f, err := ln.(*net.TCPListener).File()
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			fd := int(f.Fd())
			unix.SetNonblock(fd, true)
			remote := make(chan netip.AddrPort, 1)
			on(l, func() {
				l.Listen(fd, acceptFunc(func(l *Loop, cfd int, sa netip.AddrPort) {
					remote <- sa
					l.Add(cfd, &echo{})
				}))
			})
			if err := roundTrip(t, dial(t, ln.Addr().String()), []byte("over IPv6")); err != nil {
				t.Fatal(err)
			}
			if sa := <-remote; sa.Addr() != netip.IPv6Loopback() || sa.Port() == 0 {
				t.Fatalf("remote %v, want [::1]:port", sa)
			}
			on(l, func() { l.Unlisten(fd) })
		})
		t.Run("unix", func(t *testing.T) {
			path := t.TempDir() + "/s"
			ln, err := net.Listen("unix", path)
			if err != nil {
				t.Fatal(err)
			}
			defer ln.Close()
			go func() {
				c, err := ln.Accept()
				if err == nil {
					io.Copy(c, c)
					c.Close()
				}
			}()
			got := make(chan string, 4)
			h := &funcHandler{
				connect: func(s *Sock, err error) {
					got <- fmt.Sprint("connect ", err)
					s.Write([]byte("ping"))
				},
				read: func(s *Sock, b []byte) { got <- "read " + string(b); s.Close() },
			}
			on(l, func() {
				fd, _ := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
				if _, err := l.Connect(fd, &unix.SockaddrUnix{Name: path}, h); err != nil {
					got <- err.Error()
				}
				got <- "returned"
			})
			for _, want := range []string{"returned", "connect <nil>", "read ping"} {
				if ev := <-got; ev != want {
					t.Fatalf("event %q, want %q", ev, want)
				}
			}
		})
	})
}
