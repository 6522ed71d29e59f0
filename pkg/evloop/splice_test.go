package evloop

import (
	"bytes"
	"errors"
	"io"
	"net"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/rl-tproxy/rl-tproxy/internal/testkit"
	"golang.org/x/sys/unix"
)

type spliceEnd struct {
	moved int64
	err   error
}

// bodyRelay is the source's handler in the splice tests, used the way the
// proxy uses it: the first read's bytes (up to body) go to dst through
// its queue, the rest of the body is spliced; bytes after the body and
// the EOF are recorded.
type bodyRelay struct {
	body    int64 // bytes to bodyRelay; 0: the test calls SpliceTo itself
	dst     *Sock // loop thread
	taken   int64
	mu      sync.Mutex
	after   []byte // read after the body
	ends    chan spliceEnd
	eof     chan struct{}
	onSplic func(s *Sock, moved int64, err error)
}

func newBodyRelay(body int64) *bodyRelay {
	return &bodyRelay{body: body, ends: make(chan spliceEnd, 4), eof: make(chan struct{})}
}

func (r *bodyRelay) OnConnect(*Sock, error) {}
func (r *bodyRelay) OnError(*Sock, error)   {}
func (r *bodyRelay) OnDrained(*Sock)        {}
func (r *bodyRelay) OnEOF(*Sock)            { close(r.eof) }

func (r *bodyRelay) OnRead(s *Sock, b []byte) {
	if k := min(int64(len(b)), r.body-r.taken); k > 0 {
		r.dst.Write(b[:k])
		r.taken += k
		b = b[k:]
		if r.taken < r.body {
			if err := s.SpliceTo(r.dst, r.body-r.taken); err != nil {
				panic(err) // the test's setup is wrong
			}
		}
	}
	r.mu.Lock()
	r.after = append(r.after, b...)
	r.mu.Unlock()
}

func (r *bodyRelay) OnSpliced(s *Sock, moved int64, err error) {
	r.taken += moved
	if r.onSplic != nil {
		r.onSplic(s, moved, err)
	}
	r.ends <- spliceEnd{moved, err}
}

func (r *bodyRelay) afterBytes() []byte {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]byte(nil), r.after...)
}

// splicePair returns a loop's source and destination sockets (accepted
// in that order) and their peers: the test writes into srcPeer and reads
// from dstPeer.
func splicePair(t *testing.T, g *Group, src Handler) (s, d *Sock, srcPeer, dstPeer net.Conn) {
	t.Helper()
	n := 0
	addr, socks := accepted(t, g, func() Handler {
		n++
		if n == 1 {
			return src
		}
		return &funcHandler{}
	})
	srcPeer = dial(t, addr)
	s = <-socks
	dstPeer = dial(t, addr)
	d = <-socks
	return s, d, srcPeer, dstPeer
}

func pattern(n int, seed byte) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i%251) ^ seed
	}
	return b
}

func waitEnd(t *testing.T, r *bodyRelay) spliceEnd {
	t.Helper()
	select {
	case e := <-r.ends:
		return e
	case <-time.After(testkit.WaitBound):
		t.Fatal("no OnSpliced")
	}
	return spliceEnd{}
}

// The proxy's pattern: a body's first bytes come through OnRead and go
// to dst's queue, the rest is spliced; bytes past the body stay with the
// source and come through OnRead after OnSpliced; the EOF follows. The
// reader's small buffers make the destination fill (EAGAIN on the
// pipe's side) many times over.
func TestSpliceRelaysExactly(t *testing.T) {
	for _, tc := range []struct {
		name  string
		body  int
		extra int
	}{
		{"4MiB", 4 << 20, 0},
		{"1MiB+stray", 1 << 20, 777},
		{"one-pipe", SplicePipeSize, 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			eachBackend(t, func(t *testing.T, be Backend) {
				relayExactly(t, startGroup(t, be, 1), tc.body, tc.extra)
			})
		})
	}
}

// With io_uring's provided-buffer ring nearly empty the sources' recvs
// keep ending for lack of buffers (ENOBUFS), also while a splice waits
// for the cancel of one: every relay stays exact.
func TestSpliceWithStarvedRing(t *testing.T) {
	if err := probeUring(); err != nil {
		testkit.Missing(t, "io_uring refused on this machine: %v", err)
	}
	defer func(n uint16) { pbufEntries = n }(pbufEntries)
	pbufEntries = 2
	g := startGroup(t, IOUring, 1)
	for i := 0; i < 20; i++ {
		relayExactly(t, g, 300<<10, i)
	}
	if g.Stats().Starved == 0 {
		t.Log("no receive starved in this run: the case was not reached")
	}
}

// relayExactly relays a body of n bytes followed by extra more through a
// source and destination pair on g's first loop, the way the proxy does,
// and checks every byte and event.
func relayExactly(t *testing.T, g *Group, n, extra int) {
	t.Helper()
	r := newBodyRelay(int64(n))
	s, d, sp, dp := splicePair(t, g, r)
	// Small kernel buffers on the destination's side (not so small that
	// loopback's 64 KiB segments stall on the window).
	dp.(*net.TCPConn).SetReadBuffer(64 << 10)
	on(s.Loop(), func() {
		if err := unix.SetsockoptInt(d.FD(), unix.SOL_SOCKET, unix.SO_SNDBUF, 32<<10); err != nil {
			t.Error(err)
		}
		r.dst = d
		d.Write([]byte("head:"))
	})
	data := pattern(n+extra, 1)
	werr := make(chan error, 1)
	go func() {
		_, err := sp.Write(data)
		if err == nil {
			err = sp.(*net.TCPConn).CloseWrite()
		}
		werr <- err
	}()
	got := make([]byte, 5+n)
	if _, err := io.ReadFull(dp, got); err != nil {
		t.Fatalf("read relayed bytes: %v", err)
	}
	if string(got[:5]) != "head:" || !bytes.Equal(got[5:], data[:n]) {
		t.Fatal("relayed bytes differ from the body")
	}
	e := waitEnd(t, r)
	if e.err != nil || r.taken != int64(n) {
		t.Fatalf("OnSpliced(%d, %v); body taken %d of %d", e.moved, e.err, r.taken, n)
	}
	if err := <-werr; err != nil {
		t.Fatal(err)
	}
	select {
	case <-r.eof:
	case <-time.After(testkit.WaitBound):
		t.Fatal("no OnEOF after the splice")
	}
	if after := r.afterBytes(); !bytes.Equal(after, data[n:]) {
		t.Fatalf("%d bytes read after the body, want %d", len(after), extra)
	}
	if st := g.Stats(); st.Spliced == 0 || st.Pipes > pipesKept {
		t.Fatalf("stats %+v: want bytes spliced, at most %d pipes", st, pipesKept)
	}
	dp.SetReadDeadline(time.Now())
	if k, _ := dp.Read(got[:1]); k != 0 {
		t.Fatal("the destination got bytes past the body")
	}
	on(s.Loop(), func() { s.Close(); d.Close() })
}

// A source that ends before the bytes asked for: OnSpliced(moved,
// io.EOF) with every byte it sent delivered, then OnEOF.
func TestSpliceSourceEndsEarly(t *testing.T) {
	eachBackend(t, func(t *testing.T, be Backend) {
		g := startGroup(t, be, 1)
		r := newBodyRelay(0)
		s, d, sp, dp := splicePair(t, g, r)
		var err error
		on(s.Loop(), func() { err = s.SpliceTo(d, 10<<20) })
		if err != nil {
			t.Fatal(err)
		}
		data := pattern(300<<10, 2)
		go func() {
			sp.Write(data)
			sp.(*net.TCPConn).CloseWrite()
		}()
		got := make([]byte, len(data))
		if _, err := io.ReadFull(dp, got); err != nil || !bytes.Equal(got, data) {
			t.Fatalf("relayed bytes differ (read err %v)", err)
		}
		if e := waitEnd(t, r); e.moved != int64(len(data)) || e.err != io.EOF {
			t.Fatalf("OnSpliced(%d, %v), want (%d, EOF)", e.moved, e.err, len(data))
		}
		select {
		case <-r.eof:
		case <-time.After(testkit.WaitBound):
			t.Fatal("no OnEOF after the splice")
		}
	})
}

// The destination goes away mid-splice, closed by its handler or reset
// by its peer: the source hears of it (ErrSpliceDst), its reading is
// back, and the pipe is closed, not kept with bytes in it.
func TestSpliceDestinationGone(t *testing.T) {
	for _, how := range []string{"closed", "reset"} {
		t.Run(how, func(t *testing.T) {
			eachBackend(t, func(t *testing.T, be Backend) {
				g := startGroup(t, be, 1)
				r := newBodyRelay(0)
				s, d, sp, dp := splicePair(t, g, r)
				var err error
				on(s.Loop(), func() { err = s.SpliceTo(d, 64<<20) })
				if err != nil {
					t.Fatal(err)
				}
				go sp.Write(pattern(8<<20, 3)) // blocks once the unread bytes fill every buffer
				if _, err := io.ReadFull(dp, make([]byte, 64<<10)); err != nil {
					t.Fatal(err)
				}
				if how == "closed" {
					on(s.Loop(), func() { d.Close() })
				} else {
					dp.(*net.TCPConn).SetLinger(0)
					dp.Close()
				}
				e := waitEnd(t, r)
				if !errors.Is(e.err, ErrSpliceDst) || e.moved < 64<<10 {
					t.Fatalf("OnSpliced(%d, %v), want ≥ 64 KiB and ErrSpliceDst", e.moved, e.err)
				}
				sp.Close() // the source's reading resumed: its EOF or error arrives
				on(s.Loop(), func() { s.Close() })
				waitStats(t, g, "sockets closed, pipes kept empty", func(st Stats) bool {
					return st.Sockets == 0 && st.Pipes <= pipesKept
				})
			})
		})
	}
}

// Closing the source mid-splice ends it without a callback; the loop
// keeps no pipe with bytes and leaks no descriptor.
func TestSpliceSourceClosed(t *testing.T) {
	eachBackend(t, func(t *testing.T, be Backend) {
		g := startGroup(t, be, 1)
		r := newBodyRelay(0)
		s, d, sp, dp := splicePair(t, g, r)
		fds := openFDs(t) // the loop's, the sockets' and their peers'; no pipe yet
		on(s.Loop(), func() {
			if err := s.SpliceTo(d, 64<<20); err != nil {
				t.Error(err)
			}
		})
		go sp.Write(pattern(4<<20, 4))
		if _, err := io.ReadFull(dp, make([]byte, 32<<10)); err != nil {
			t.Fatal(err)
		}
		on(s.Loop(), func() {
			s.Close()
			if d.Splicing() {
				t.Error("destination still in the closed source's splice")
			}
			d.Write([]byte("after")) // the destination is writable as usual
		})
		select {
		case e := <-r.ends:
			t.Fatalf("OnSpliced(%d, %v) after the source closed", e.moved, e.err)
		default:
		}
		on(s.Loop(), func() { d.Close() })
		sp.Close()
		dp.Close()
		if err := g.Close(); err != nil {
			t.Fatal(err)
		}
		if n := openFDs(t); n > fds {
			t.Errorf("%d descriptors open after the group closed, %d before", n, fds)
		}
	})
}

// SpliceTo refuses what it cannot do, with an error and no change.
func TestSpliceRefusals(t *testing.T) {
	eachBackend(t, func(t *testing.T, be Backend) {
		g := startGroup(t, be, 1)
		r := newBodyRelay(0)
		s, d, _, _ := splicePair(t, g, r)
		on(s.Loop(), func() {
			for _, tc := range []struct {
				name     string
				src, dst *Sock
				n        int64
			}{
				{"zero bytes", s, d, 0},
				{"negative", s, d, -1},
				{"to itself", s, s, 1},
				{"no SpliceHandler", d, s, 1},
			} {
				if err := tc.src.SpliceTo(tc.dst, tc.n); err == nil {
					t.Errorf("%s: accepted", tc.name)
				}
			}
			if s.Splicing() || d.Splicing() {
				t.Error("a refused splice left a socket splicing")
			}
			if err := s.SpliceTo(d, 1<<20); err != nil {
				t.Fatal(err)
			}
			if err := s.SpliceTo(d, 1); err == nil {
				t.Error("a second splice on the same sockets accepted")
			}
			d.Close()
			if err := s.SpliceTo(d, 1); err == nil {
				t.Error("a splice to a closed socket accepted")
			}
		})
		if e := waitEnd(t, r); !errors.Is(e.err, ErrSpliceDst) {
			t.Fatalf("OnSpliced(%d, %v), want ErrSpliceDst", e.moved, e.err)
		}
	})
}

// openFDs counts the process's open descriptors.
func openFDs(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skipf("no /proc/self/fd: %v", err)
	}
	return len(ents)
}

// A splice waits for its source's recv to end before the pipe takes
// bytes; a recv that ended for lack of buffers (ENOBUFS, the socket
// marked starved) must start it too. Before, that end deferred nothing
// (and re-armed nothing): the splice stalled unless the destination
// happened to drain a queued write later.
func TestSpliceAfterStarvedRecv(t *testing.T) {
	if err := probeUring(); err != nil {
		testkit.Missing(t, "io_uring refused on this machine: %v", err)
	}
	g := startGroup(t, IOUring, 1)
	l := g.Loops()[0]
	on(l, func() {
		s := &Sock{l: l, fd: -1, flags: fSplice | fStarved} // not in the table: never dispatched
		s.spl = &splice{src: s}
		n := len(l.later)
		l.ur.recvEnded(s)
		if len(l.later) != n+1 || l.later[n] != s {
			t.Error("the starved source's splice was not scheduled")
		} else {
			l.later = l.later[:n] // the fake socket must not run
		}
		if s.flags&fArmed != 0 {
			t.Error("a recv was armed on a splice's source")
		}
	})
}
