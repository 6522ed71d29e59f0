package evloop

// Edge cases of a socket's life: a Detach pending at Group.Close,
// CloseWrite during a Connect, and the peer's shutdown on an AF_UNIX
// socket under io_uring.

import (
	"io"
	"math/rand/v2"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rl-tproxy/rl-tproxy/internal/testkit"
	"golang.org/x/sys/unix"
)

// TestDetachThenGroupClose: a Detach still waiting for its queued
// bytes when the group closes must not be told that they reached the
// kernel. The doc says fn gets the fd "once the queued bytes reached the
// kernel", and Group.Close that "no callbacks run"; shutdown drops the
// queue (dropOut) and then finish hands fn the fd with a nil error.
func TestDetachThenGroupClose(t *testing.T) {
	eachBackend(t, func(t *testing.T, be Backend) {
		g, err := Start(Config{Loops: 1, Backend: be, Logger: quietLogger()})
		if err != nil {
			t.Fatal(err)
		}
		fd, c := pairFDs(t)
		type result struct {
			fd      int
			err     error
			pending int
		}
		res := make(chan result, 1)
		queued := make(chan int, 1)
		l := g.Loops()[0]
		on(l, func() {
			s, err := l.Add(fd, &funcHandler{})
			if err != nil {
				t.Error(err)
				return
			}
			s.Write(make([]byte, 8<<20)) // the peer never reads: most stays queued
			queued <- s.Pending()
			s.Detach(func(fd int, err error) {
				res <- result{fd, err, 0}
			})
		})
		if p := <-queued; p == 0 {
			t.Skip("the kernel took 8 MiB at once; nothing stays queued")
		}
		// io_uring: let the send be submitted and come back short.
		on(l, func() {})
		on(l, func() {})
		if err := g.Close(); err != nil {
			t.Fatal(err)
		}
		_ = c
		select {
		case r := <-res:
			if r.fd >= 0 {
				unix.Close(r.fd)
			}
			if r.err == nil {
				t.Fatalf("Detach callback got fd %d and no error at Group.Close, but its queued bytes were dropped", r.fd)
			}
		default: // not called: acceptable per "no callbacks run"
		}
	})
}

// TestCloseWriteWhileConnecting: CloseWrite right after Connect,
// while the connect is still in progress (the listener's queue is full,
// so the SYN waits for a retransmit) and with nothing written, must shut
// the write side once connected (the peer reads EOF). shutdown(SHUT_WR)
// on a socket in SYN_SENT disconnects it instead (inet_shutdown).
func TestCloseWriteWhileConnecting(t *testing.T) {
	eachBackend(t, func(t *testing.T, be Backend) {
		g := startGroup(t, be, 1)
		lfd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer unix.Close(lfd)
		if err := unix.Bind(lfd, &unix.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
			t.Fatal(err)
		}
		if err := unix.Listen(lfd, 0); err != nil {
			t.Fatal(err)
		}
		sa, _ := unix.Getsockname(lfd)
		lsa := sa.(*unix.SockaddrInet4)
		// Fill the accept queue so that the next SYN is dropped.
		for i := 0; i < 2; i++ {
			fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
			if err != nil {
				t.Fatal(err)
			}
			defer unix.Close(fd)
			unix.Connect(fd, &unix.SockaddrInet4{Addr: lsa.Addr, Port: lsa.Port})
		}
		time.Sleep(50 * time.Millisecond) // let the handshakes land in the queue (setup, not synchronisation of the code under test)
		l := g.Loops()[0]
		connErr := make(chan error, 1)
		var inProgress bool
		var s *Sock
		on(l, func() {
			fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
			if err != nil {
				t.Error(err)
				return
			}
			s, err = l.Connect(fd, &unix.SockaddrInet4{Addr: lsa.Addr, Port: lsa.Port}, &funcHandler{
				connect: func(_ *Sock, err error) { connErr <- err },
			})
			if err != nil {
				unix.Close(fd)
				t.Error(err)
				return
			}
			inProgress = s.flags&fConnecting != 0
			s.CloseWrite()
		})
		if !inProgress {
			t.Skip("connect completed at once; nothing to test")
		}
		// Free the queue: the SYN's retransmit (about 1 s) then connects.
		for i := 0; i < 2; i++ {
			testkit.WaitFor(t, "a queued connection", func() bool {
				nfd, _, err := unix.Accept4(lfd, unix.SOCK_CLOEXEC)
				if err == nil {
					unix.Close(nfd)
				}
				return err == nil
			})
		}
		var nfd int
		accepted := false
		deadline := time.Now().Add(10 * time.Second)
		for time.Now().Before(deadline) && !accepted {
			var err error
			if nfd, _, err = unix.Accept4(lfd, unix.SOCK_CLOEXEC); err == nil {
				accepted = true
				break
			}
			select {
			case err := <-connErr:
				if err != nil {
					t.Fatalf("connect failed after CloseWrite: %v", err)
				}
				connErr <- nil
			case <-time.After(20 * time.Millisecond):
			}
		}
		if !accepted {
			t.Fatal("the connect never reached the listener after CloseWrite")
		}
		f := osFile(nfd)
		c, err := net.FileConn(f)
		f.Close()
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		c.SetReadDeadline(time.Now().Add(testkit.WaitBound))
		if n, err := c.Read(make([]byte, 1)); err != io.EOF {
			t.Fatalf("peer read %d, %v; want EOF (the write side shut)", n, err)
		}
	})
}

// TestChaosUnix is TestChaosTCP over AF_UNIX socketpairs.
func TestChaosUnix(t *testing.T) { testChaos(t, "unix") }

// TestUnixEOFAfterStream: an AF_UNIX stream peer that sends a
// stream of writes and then shuts its write side must reach OnEOF (the
// proxy Connects to Unix-socket upstreams).
func TestUnixEOFAfterStream(t *testing.T) {
	eachBackend(t, func(t *testing.T, be Backend) {
		g := startGroup(t, be, 1)
		l := g.Loops()[0]
		const conns = 32
		var eofs atomic.Int32
		var got [conns]atomic.Int64
		for i := 0; i < conns; i++ {
			fd, c := pairFDs(t)
			on(l, func() {
				_, err := l.Add(fd, &funcHandler{
					read: func(s *Sock, b []byte) { got[i].Add(int64(len(b))) },
					eof:  func(s *Sock) { eofs.Add(1); s.Close() },
				})
				if err != nil {
					t.Error(err)
				}
			})
			go func() {
				rng := rand.New(rand.NewPCG(uint64(i), 5))
				buf := make([]byte, 64<<10)
				for sent := 0; sent < 1<<20; {
					n := 1 + rng.IntN(len(buf))
					if _, err := c.Write(buf[:n]); err != nil {
						return
					}
					sent += n
				}
				c.(*net.UnixConn).CloseWrite()
			}()
		}
		testkit.WaitFor(t, "every peer's EOF", func() bool { return eofs.Load() == conns })
	})
}
