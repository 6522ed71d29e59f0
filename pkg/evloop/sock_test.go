package evloop

import (
	"bytes"
	"io"
	"net"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rl-tproxy/rl-tproxy/internal/testkit"
	"golang.org/x/sys/unix"
)

// TestBackpressure: a peer that does not read makes Pending grow (the
// kernel stops taking bytes); PauseRead stops OnRead while bytes wait in
// the kernel; ResumeRead delivers them; OnDrained comes once the peer
// reads everything.
func TestBackpressure(t *testing.T) {
	eachBackend(t, func(t *testing.T, be Backend) {
		g := startGroup(t, be, 1)
		l := g.Loops()[0]
		var reads, drained atomic.Int64
		var received bytes.Buffer // loop thread only
		addr, socks := accepted(t, g, func() Handler {
			return &funcHandler{
				read:    func(s *Sock, b []byte) { reads.Add(1); received.Write(b) },
				drained: func(*Sock) { drained.Add(1) },
			}
		})
		c := dial(t, addr)
		s := <-socks
		chunk := make([]byte, 64<<10)
		var pending int
		// One chunk per turn until the kernel stops taking them.
		for i := 0; i < 512 && pending <= 1<<20; i++ {
			on(l, func() { s.Write(chunk) })
			on(l, func() { pending = s.Pending() })
		}
		if pending <= 1<<20 {
			t.Fatalf("32 MiB written to a peer that does not read, Pending %d", pending)
		}
		on(l, func() { s.Write(chunk, chunk) })
		on(l, func() {
			if s.Pending() <= pending+len(chunk) {
				t.Errorf("Pending %d after two more chunks, was %d", s.Pending(), pending)
			}
			drained.Store(0) // earlier chunks may have drained before the kernel filled
			s.PauseRead()
		})
		// While paused: bytes from the peer stay in the kernel.
		c.Write([]byte("paused bytes"))
		testkit.WaitFor(t, "bytes in the server socket", func() bool {
			var n int
			on(l, func() { n, _ = unix.IoctlGetInt(s.FD(), unix.SIOCINQ) })
			return n > 0 || reads.Load() > 0
		})
		// A second connection's bytes sent after them arrive and are read:
		// the loop has seen the paused socket's readiness by then.
		marker := dial(t, addr)
		s2 := <-socks
		marker.Write([]byte("m"))
		testkit.WaitFor(t, "the marker read", func() bool { return reads.Load() > 0 })
		if n := reads.Load(); n != 1 {
			t.Fatalf("%d reads while paused, want only the marker's", n)
		}
		on(l, func() { s2.Close(); received.Reset(); s.ResumeRead() })
		// The peer reads everything: the queue drains.
		go io.Copy(io.Discard, c)
		testkit.WaitFor(t, "OnDrained", func() bool { return drained.Load() > 0 })
		var got string
		on(l, func() { got = received.String() })
		if got != "paused bytes" {
			t.Fatalf("after ResumeRead got %q", got)
		}
		on(l, func() {
			if s.Pending() != 0 {
				t.Errorf("Pending %d after OnDrained", s.Pending())
			}
		})
		waitStats(t, g, "no buffer held after drain", func(st Stats) bool { return st.Buffers == 0 })
	})
}

// TestEOFAndError: a half-close is OnEOF and the socket can still write;
// a reset is OnError, then the loop closes the socket.
func TestEOFAndError(t *testing.T) {
	eachBackend(t, func(t *testing.T, be Backend) {
		g := startGroup(t, be, 1)
		events := make(chan string, 16)
		addr, _ := accepted(t, g, func() Handler {
			return &funcHandler{
				read: func(s *Sock, b []byte) { events <- "read " + string(b) },
				eof: func(s *Sock) {
					events <- "eof"
					s.Write([]byte("after eof"))
					s.CloseWrite()
				},
				fail: func(s *Sock, err error) { events <- "error " + err.Error() },
			}
		})
		c := dial(t, addr)
		c.Write([]byte("hi"))
		if ev := <-events; ev != "read hi" {
			t.Fatalf("event %q", ev)
		}
		c.(*net.TCPConn).CloseWrite()
		if ev := <-events; ev != "eof" {
			t.Fatalf("event %q, want eof", ev)
		}
		b, err := io.ReadAll(c)
		if err != nil || string(b) != "after eof" {
			t.Fatalf("after the half-close read %q, %v", b, err)
		}

		c2 := dial(t, addr)
		c2.Write([]byte("x"))
		<-events
		c2.(*net.TCPConn).SetLinger(0)
		c2.Close() // RST
		ev := <-events
		if !strings.HasPrefix(ev, "error ") || !strings.Contains(ev, "reset") {
			t.Fatalf("event %q, want a reset error", ev)
		}
		waitStats(t, g, "reset socket closed by the loop", func(s Stats) bool { return s.Sockets == 1 })
	})
}

// TestDetach: a detached socket works in a goroutine through net.FileConn,
// after the loop wrote what was queued; the loop neither reads nor closes
// it.
func TestDetach(t *testing.T) {
	eachBackend(t, func(t *testing.T, be Backend) {
		g := startGroup(t, be, 1)
		big := bytes.Repeat([]byte("q"), 4<<20)
		type result struct {
			fd  int
			err error
		}
		res := make(chan result, 1)
		addr, _ := accepted(t, g, func() Handler {
			return &funcHandler{read: func(s *Sock, b []byte) {
				if string(b) != "detach me" {
					t.Errorf("read %q", b)
				}
				s.Write(big) // mostly queued: the client does not read yet
				s.Detach(func(fd int, err error) { res <- result{fd, err} })
				s.Write([]byte("dropped"))
			}}
		})
		c := dial(t, addr)
		c.Write([]byte("detach me"))
		got := readN(t, c, len(big))
		if !bytes.Equal(got, big) {
			t.Fatal("queued bytes before the detach differ")
		}
		r := <-res
		if r.err != nil {
			t.Fatalf("detach: %v", r.err)
		}
		f := os.NewFile(uintptr(r.fd), "detached")
		fc, err := net.FileConn(f)
		f.Close()
		if err != nil {
			t.Fatal(err)
		}
		defer fc.Close()
		c.Write([]byte("ping"))
		fc.SetReadDeadline(time.Now().Add(testkit.WaitBound))
		if b := readN(t, fc, 4); string(b) != "ping" {
			t.Fatalf("detached fd read %q", b)
		}
		fc.Write([]byte("pong"))
		if b := readN(t, c, 4); string(b) != "pong" {
			t.Fatalf("client read %q", b)
		}
		waitStats(t, g, "detached socket left the table", func(s Stats) bool { return s.Sockets == 0 && s.Buffers == 0 })
	})
}

// TestCloseInFlight: Close with megabytes queued (and, on io_uring, a
// send and a recv in flight) gives no more callbacks and closes the fd.
func TestCloseInFlight(t *testing.T) {
	eachBackend(t, func(t *testing.T, be Backend) {
		g := startGroup(t, be, 1)
		var after atomic.Int64
		closed := make(chan struct{})
		addr, _ := accepted(t, g, func() Handler {
			var done bool
			return &funcHandler{
				read: func(s *Sock, b []byte) {
					if done {
						after.Add(1)
						return
					}
					done = true
					s.Write(make([]byte, 8<<20))
					s.Close()
					s.Close()
					s.Write([]byte("x")) // ignored
					s.PauseRead()
					s.ResumeRead()
					s.CloseWrite()
					if s.FD() != -1 && be == Epoll {
						t.Errorf("fd %d after Close", s.FD())
					}
					close(closed)
				},
				eof:     func(*Sock) { after.Add(1) },
				fail:    func(*Sock, error) { after.Add(1) },
				drained: func(*Sock) { after.Add(1) },
			}
		})
		c := dial(t, addr)
		c.Write([]byte("go"))
		<-closed
		c.Write([]byte("more"))
		c.SetReadDeadline(time.Now().Add(testkit.WaitBound))
		io.Copy(io.Discard, c) // EOF or reset: either is fine
		waitStats(t, g, "closed socket released", func(s Stats) bool { return s.Sockets == 0 && s.Buffers == 0 })
		if n := after.Load(); n != 0 {
			t.Fatalf("%d callbacks after Close", n)
		}
	})
}

// TestManyConnections: 1000 connections open at once, each echoes once,
// then all close; the table and buffers return to empty.
func TestManyConnections(t *testing.T) {
	eachBackend(t, func(t *testing.T, be Backend) {
		g := startGroup(t, be, 2)
		fd, addr := listenFD(t)
		listenAll(t, g, fd, func() Handler { return &echo{} })
		const n = 1000
		conns := make([]net.Conn, 0, n)
		for i := 0; i < n; i++ {
			conns = append(conns, dial(t, addr))
		}
		waitStats(t, g, "all connections accepted", func(s Stats) bool { return s.Sockets == n })
		if b := g.Stats().Buffers; b != 0 {
			t.Fatalf("%d idle connections hold %d buffers", n, b)
		}
		var wg sync.WaitGroup
		for i, c := range conns {
			wg.Add(1)
			go func() {
				defer wg.Done()
				msg := []byte{byte(i), byte(i >> 8), 'x'}
				c.Write(msg)
				if !bytes.Equal(readN(t, c, 3), msg) {
					t.Errorf("conn %d: wrong echo", i)
				}
				c.Close()
			}()
		}
		wg.Wait()
		waitStats(t, g, "all closed", func(s Stats) bool { return s.Sockets == 0 && s.Buffers == 0 })
	})
}

// TestUnlisten: after Unlisten the loops leave new connections in the
// listener's queue; the listener is still open (a plain accept gets them).
func TestUnlisten(t *testing.T) {
	eachBackend(t, func(t *testing.T, be Backend) {
		g := startGroup(t, be, 2)
		fd, addr := listenFD(t)
		listenAll(t, g, fd, func() Handler { return &echo{} })
		if err := roundTrip(t, dial(t, addr), []byte("before")); err != nil {
			t.Fatal(err)
		}
		for _, l := range g.Loops() {
			on(l, func() {
				if err := l.Listen(fd, nil); err == nil {
					t.Error("listening twice on one fd accepted")
				}
				sfd, _ := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
				if err := l.Listen(sfd, nil); err == nil {
					t.Error("Listen accepted a socket that does not listen")
				}
				unix.Close(sfd)
				l.Unlisten(fd)
			})
		}
		// io_uring: the cancel completes in a later turn; then nothing
		// takes connections any more.
		for _, l := range g.Loops() {
			on(l, func() {})
			on(l, func() {})
		}
		c := dial(t, addr)
		var nfd int
		testkit.WaitFor(t, "the connection in the listener's queue", func() bool {
			var err error
			nfd, _, err = unix.Accept4(fd, unix.SOCK_CLOEXEC)
			return err == nil
		})
		unix.Close(nfd)
		c.Close()
		waitStats(t, g, "no socket", func(s Stats) bool { return s.Sockets == 0 })
	})
}

// TestGroupClose: Close closes the loops' sockets (the peer sees EOF) and
// runs no posted function afterwards.
func TestGroupClose(t *testing.T) {
	eachBackend(t, func(t *testing.T, be Backend) {
		g, err := Start(Config{Loops: 2, Backend: be, Logger: quietLogger()})
		if err != nil {
			t.Fatal(err)
		}
		fd, addr := listenFD(t)
		listenAll(t, g, fd, func() Handler { return &echo{} })
		var cs []net.Conn
		for i := 0; i < 10; i++ {
			c := dial(t, addr)
			cs = append(cs, c)
		}
		waitStats(t, g, "accepted", func(s Stats) bool { return s.Sockets == 10 })
		if err := g.Close(); err != nil {
			t.Fatal(err)
		}
		if err := g.Close(); err != nil {
			t.Fatal(err)
		}
		for _, c := range cs {
			c.SetReadDeadline(time.Now().Add(testkit.WaitBound))
			if _, err := c.Read(make([]byte, 1)); err != io.EOF {
				t.Fatalf("read after Group.Close: %v, want EOF", err)
			}
		}
		g.Loops()[0].Post(func() { t.Error("posted function ran after Close") })
	})
}
