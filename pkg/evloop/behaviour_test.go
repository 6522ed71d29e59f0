package evloop

// Behaviour tests: each pins one behaviour the package doc promises, on
// both backends where both apply. The chaos test runs over TCP here and
// over AF_UNIX socketpairs in edgecase_test.go.

import (
	"bytes"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rl-tproxy/rl-tproxy/internal/testkit"
	"golang.org/x/sys/unix"
)

// pairFDs returns a connected AF_UNIX stream pair: the loop's end
// non-blocking, the test's end blocking (as a net.Conn).
func pairFDs(t *testing.T) (int, net.Conn) {
	t.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.SetNonblock(fds[0], true); err != nil {
		t.Fatal(err)
	}
	f := osFile(fds[1])
	c, err := net.FileConn(f)
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	c.SetDeadline(time.Now().Add(testkit.WaitBound))
	return fds[0], c
}

// TestTimerChurnFromHandlers: timers stopped and reset from inside other
// timers' callbacks (and their own) keep the heap valid, never fire
// while stopped, and never fire before their deadline.
func TestTimerChurnFromHandlers(t *testing.T) {
	eachBackend(t, func(t *testing.T, be Backend) {
		g := startGroup(t, be, 1)
		l := g.Loops()[0]
		const n = 64
		type tstate struct {
			tm    Timer
			armed bool
			at    int64
		}
		ts := make([]*tstate, n)
		rng := rand.New(rand.NewPCG(1, 2))
		var fired, bad atomic.Int64
		done := make(chan struct{})
		check := func() string {
			h := l.timers
			for i, tm := range h {
				if tm.idx != i {
					return "idx mismatch"
				}
				if i > 0 && h[(i-1)/2].at > tm.at {
					return "heap order broken"
				}
			}
			for _, s := range ts {
				if s.armed != s.tm.Armed() {
					return "Armed() disagrees with the test's model"
				}
			}
			return ""
		}
		on(l, func() {
			for i := range ts {
				s := &tstate{}
				ts[i] = s
				s.tm.Init(l, func() {
					if !s.armed {
						bad.Add(1)
					}
					if l.Now() < s.at {
						bad.Add(1)
					}
					s.armed = false
					if fired.Add(1) == 2000 {
						close(done)
						return
					}
					if fired.Load() > 2000 {
						return
					}
					for k := 0; k < 4; k++ {
						o := ts[rng.IntN(n)]
						switch rng.IntN(3) {
						case 0:
							o.tm.Stop()
							o.armed = false
						default:
							o.at = l.Now() + int64(rng.IntN(2000))*1000 - 200_000 // some in the past
							o.tm.Reset(o.at)
							o.armed = true
						}
					}
					if msg := check(); msg != "" {
						t.Error(msg)
					}
				})
				s.at = l.Now() + int64(i)*1000
				s.tm.Reset(s.at)
				s.armed = true
			}
		})
		select {
		case <-done:
		case <-time.After(testkit.WaitBound):
			t.Fatal("timers stopped firing")
		}
		on(l, func() {
			if msg := check(); msg != "" {
				t.Error(msg)
			}
			for _, s := range ts {
				s.tm.Stop()
			}
		})
		if b := bad.Load(); b != 0 {
			t.Fatalf("%d timer firings while stopped or before the deadline", b)
		}
	})
}

// TestWriteManyBuffersPartial: one Write of many buffers (more than one
// writev's worth), of which the kernel takes only part, followed by more
// Writes, arrives complete and in order.
func TestWriteManyBuffersPartial(t *testing.T) {
	eachBackend(t, func(t *testing.T, be Backend) {
		g := startGroup(t, be, 1)
		fd, c := pairFDs(t)
		unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_SNDBUF, 4096)
		var want bytes.Buffer
		var bufs [][]byte
		for i := 0; i < 40; i++ {
			b := bytes.Repeat([]byte{byte('a' + i%26)}, 1+(i*7919)%50000)
			if i%5 == 0 {
				b = nil // empty buffers are legal and skipped
			}
			bufs = append(bufs, b)
			want.Write(b)
		}
		tail := []byte("-the-end-")
		want.Write(tail)
		l := g.Loops()[0]
		on(l, func() {
			s, err := l.Add(fd, &funcHandler{})
			if err != nil {
				t.Error(err)
				return
			}
			s.Write(bufs...)
			s.Write(tail[:3], tail[3:])
		})
		got := make([]byte, want.Len())
		if _, err := io.ReadFull(c, got); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want.Bytes()) {
			t.Fatal("bytes differ from what was written, in order")
		}
	})
}

// TestEOFWhilePaused: the peer sends and shuts its write side while
// reading is paused; after ResumeRead every byte comes, then one OnEOF.
func TestEOFWhilePaused(t *testing.T) {
	eachBackend(t, func(t *testing.T, be Backend) {
		g := startGroup(t, be, 1)
		fd, c := pairFDs(t)
		l := g.Loops()[0]
		var got bytes.Buffer
		var eofs atomic.Int32
		var order atomic.Bool // data after EOF
		first := make(chan *Sock, 1)
		on(l, func() {
			var paused bool
			_, err := l.Add(fd, &funcHandler{
				read: func(s *Sock, b []byte) {
					if eofs.Load() > 0 {
						order.Store(true)
					}
					got.Write(b)
					if !paused {
						paused = true
						s.PauseRead()
						first <- s
					}
				},
				eof: func(*Sock) { eofs.Add(1) },
			})
			if err != nil {
				t.Error(err)
			}
		})
		c.Write([]byte("one"))
		s := <-first
		c.Write([]byte("two"))
		c.(*net.UnixConn).CloseWrite()
		// Let the FIN reach the loop while paused (both backends see it
		// as an event or a recv completion).
		on(l, func() {})
		on(l, func() {})
		on(l, func() { s.ResumeRead() })
		testkit.WaitFor(t, "EOF after resume", func() bool { return eofs.Load() > 0 })
		on(l, func() {})
		if n := eofs.Load(); n != 1 {
			t.Fatalf("%d OnEOF calls", n)
		}
		if order.Load() {
			t.Fatal("OnRead after OnEOF")
		}
		var s2 string
		on(l, func() { s2 = got.String() })
		if s2 != "onetwo" {
			t.Fatalf("read %q, want onetwo", s2)
		}
	})
}

// TestStarvedWhilePaused: with a tiny provided-buffer ring, sockets
// that pause and resume at random while the ring runs dry all get every
// byte (no socket is left without a recv armed).
func TestStarvedWhilePaused(t *testing.T) {
	if err := probeUring(); err != nil {
		testkit.Missing(t, "io_uring refused on this machine: %v", err)
	}
	defer func(n uint16) { pbufEntries = n }(pbufEntries)
	pbufEntries = 2
	g := startGroup(t, IOUring, 1)
	l := g.Loops()[0]
	const conns, size = 8, 512 << 10
	var total [conns]atomic.Int64
	cs := make([]net.Conn, conns)
	for i := 0; i < conns; i++ {
		fd, c := pairFDs(t)
		cs[i] = c
		on(l, func() {
			rng := rand.New(rand.NewPCG(uint64(i), 7))
			var tm Timer
			var s *Sock
			tm.Init(l, func() { s.ResumeRead() })
			var err error
			s, err = l.Add(fd, &funcHandler{read: func(s *Sock, b []byte) {
				total[i].Add(int64(len(b)))
				if rng.IntN(4) == 0 {
					s.PauseRead()
					tm.Reset(l.Now() + int64(rng.IntN(200))*1000)
				}
			}})
			if err != nil {
				t.Error(err)
			}
		})
	}
	for _, c := range cs {
		go c.Write(make([]byte, size))
	}
	for i := range total {
		testkit.WaitFor(t, "every byte read", func() bool { return total[i].Load() == size })
	}
	if g.Stats().Starved == 0 {
		t.Fatal("the ring never ran dry: the test did not test ENOBUFS")
	}
}

// tcpPairFDs is pairFDs over loopback TCP: the loop's end (accepted,
// non-blocking) and the test's end.
func tcpPairFDs(t *testing.T) (int, net.Conn) {
	t.Helper()
	lfd, addr := listenFD(t)
	c := dial(t, addr)
	var fd int
	testkit.WaitFor(t, "accept", func() bool {
		var err error
		fd, _, err = unix.Accept4(lfd, unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC)
		return err == nil
	})
	return fd, c
}

func osFile(fd int) *os.File { return os.NewFile(uintptr(fd), "evloop-test") }

// chaos is a handler that echoes and, at random, pauses (resumed by a
// timer), half-closes, closes or detaches; it records any callback that
// comes after Close or Detach.
type chaos struct {
	rng        *rand.Rand
	tm         Timer
	s          *Sock
	gone       bool
	detached   atomic.Int32 // Detach callbacks
	violations *atomic.Int64
	hist       []string
	got, sent  atomic.Int64
}

func (h *chaos) note(format string, args ...any) {
	h.hist = append(h.hist, fmt.Sprintf(format, args...))
	if len(h.hist) > 12 {
		h.hist = h.hist[1:]
	}
}

func (h *chaos) check() {
	if h.gone {
		h.violations.Add(1)
	}
}

func (h *chaos) OnConnect(*Sock, error) { h.check() }

func (h *chaos) OnRead(s *Sock, b []byte) {
	h.check()
	h.note("read %d", len(b))
	h.got.Add(int64(len(b)))
	s.Write(b[:len(b)/2], b[len(b)/2:])
	switch h.rng.IntN(600) {
	case 0:
		h.gone = true
		s.Close()
	case 1:
		h.gone = true
		s.Detach(func(fd int, err error) {
			h.detached.Add(1)
			if fd >= 0 {
				unix.Close(fd)
			}
		})
	case 2, 3, 4, 5:
		s.PauseRead()
		h.note("pause flags %#x", s.flags)
		h.tm.Reset(s.Loop().Now() + int64(h.rng.IntN(500))*1000)
	case 6:
		s.CloseWrite()
	}
}

func (h *chaos) OnEOF(s *Sock) {
	h.check()
	h.gone = true
	s.Close()
}

func (h *chaos) OnError(*Sock, error) {
	h.check()
	h.gone = true
}

func (h *chaos) OnDrained(*Sock) { h.check() }

// TestChaosTCP: sockets that echo while their handlers pause, resume,
// half-close, close and detach at random get no callback after Close or
// Detach, every Detach callback runs exactly once, and the loop's table
// and buffers empty out.
func TestChaosTCP(t *testing.T) { testChaos(t, "tcp") }

func testChaos(t *testing.T, kind string) {
	eachBackend(t, func(t *testing.T, be Backend) {
		g := startGroup(t, be, 2)
		const conns = 48
		var violations atomic.Int64
		hs := make([]*chaos, conns)
		done := make(chan struct{}, 2*conns)
		for i := 0; i < conns; i++ {
			fd, c := pairFDs(t)
			if kind == "tcp" {
				unix.Close(fd)
				c.Close()
				fd, c = tcpPairFDs(t)
			}
			l := g.Loops()[i%2]
			h := &chaos{rng: rand.New(rand.NewPCG(uint64(i), 99)), violations: &violations}
			hs[i] = h
			on(l, func() {
				h.tm.Init(l, func() {
					if !h.gone {
						h.note("resume flags %#x", h.s.flags)
						h.s.ResumeRead()
						h.note("resumed flags %#x", h.s.flags)
					}
				})
				s, err := l.Add(fd, h)
				if err != nil {
					t.Error(err)
					return
				}
				h.s = s
			})
			go func() { // writer
				rng := rand.New(rand.NewPCG(uint64(i), 5))
				buf := make([]byte, 64<<10)
				for sent := 0; sent < 1<<20; {
					n := 1 + rng.IntN(len(buf))
					if _, err := c.Write(buf[:n]); err != nil {
						break
					}
					sent += n
					h.sent.Add(int64(n))
				}
				c.(interface{ CloseWrite() error }).CloseWrite()
				done <- struct{}{}
			}()
			go func() { // reader
				io.Copy(io.Discard, c)
				done <- struct{}{}
			}()
		}
		for i := 0; i < 2*conns; i++ {
			select {
			case <-done:
			case <-time.After(testkit.WaitBound):
				t.Fatal("a peer never finished (a socket stuck?)")
			}
		}
		defer func() {
			if !t.Failed() {
				return
			}
			for _, l := range g.Loops() {
				on(l, func() {
					for _, s := range l.socks {
						if s != nil {
							t.Logf("loop %d: left: fd %d flags %#x inflight %d pending %d sending %v stash %d err %v",
								l.ID(), s.fd, s.flags, s.inflight, s.Pending(), s.isSending(), len(s.stash), s.err)
							nread, _ := unix.IoctlGetInt(s.fd, unix.SIOCINQ)
							t.Logf("  ud %#x, %d bytes readable in the kernel", s.ud(udSock), nread)
							if l.ur != nil {
								b, _ := os.ReadFile(fmt.Sprintf("/proc/self/fdinfo/%d", l.ur.r.fd))
								t.Logf("  ring fdinfo:\n%s", b)
							}
							for _, h := range hs {
								if h.s == s {
									t.Logf("  history: %q; read %d of %d sent", h.hist, h.got.Load(), h.sent.Load())
								}
							}
						}
					}
				})
			}
		}()
		waitStats(t, g, "every socket released", func(s Stats) bool { return s.Sockets == 0 && s.Buffers == 0 })
		if v := violations.Load(); v != 0 {
			t.Errorf("%d callbacks after Close or Detach", v)
		}
		var nDetached int
		for i, h := range hs {
			nDetached += int(h.detached.Load())
			if n := h.detached.Load(); n > 1 {
				t.Errorf("conn %d: Detach callback ran %d times", i, n)
			}
		}
		if nDetached == 0 {
			t.Error("no connection detached: the test did not test Detach")
		}
		t.Logf("%d of %d connections detached, %d turns", nDetached, conns, g.Stats().Turns)
	})
}
