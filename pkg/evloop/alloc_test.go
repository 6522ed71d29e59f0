//go:build !race

package evloop

import (
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// echoTimed echoes and pushes an idle timer forward on every read, as a
// keep-alive connection does.
type echoTimed struct {
	echo
	idle Timer
}

func (e *echoTimed) OnRead(s *Sock, b []byte) {
	if e.idle.l == nil {
		e.idle.Init(s.Loop(), func() {})
	}
	e.idle.Reset(s.Loop().Now() + int64(time.Minute))
	s.Write(b[:len(b)/2], b[len(b)/2:])
}

// TestAllocsPerEcho: a read event, a write and a timer Reset allocate
// nothing in steady state, on either backend (client included).
func TestAllocsPerEcho(t *testing.T) {
	eachBackend(t, func(t *testing.T, be Backend) {
		g := startGroup(t, be, 1)
		addr, _ := accepted(t, g, func() Handler { return &echoTimed{} })
		fd := rawClient(t, addr)
		msg := make([]byte, 512)
		got := make([]byte, 512)
		roundTrip := func() {
			if _, err := unix.Write(fd, msg); err != nil {
				t.Fatal(err)
			}
			for n := 0; n < len(msg); {
				k, err := unix.Read(fd, got[n:])
				if err != nil || k == 0 {
					t.Fatalf("read: %d, %v", k, err)
				}
				n += k
			}
		}
		for i := 0; i < 100; i++ {
			roundTrip() // warm: pools, heaps, slices at their size
		}
		if a := testing.AllocsPerRun(2000, roundTrip); a != 0 {
			t.Fatalf("%v allocations per echo round trip, want 0", a)
		}
	})
}

// TestAllocsPerTimer: a timer that fires and re-arms itself allocates
// nothing per event.
func TestAllocsPerTimer(t *testing.T) {
	eachBackend(t, func(t *testing.T, be Backend) {
		g := startGroup(t, be, 1)
		l := g.Loops()[0]
		efd, err := unix.Eventfd(0, unix.EFD_CLOEXEC)
		if err != nil {
			t.Fatal(err)
		}
		defer unix.Close(efd)
		var tm Timer
		var fires int
		on(l, func() {
			tm.Init(l, func() {
				fires++
				unix.Write(efd, eventfdOne[:])
				tm.Reset(l.Now() + int64(50*time.Microsecond))
			})
			tm.Reset(l.Now())
		})
		var b [8]byte
		wait := func() {
			if _, err := unix.Read(efd, b[:]); err != nil {
				t.Fatal(err)
			}
		}
		for i := 0; i < 50; i++ {
			wait()
		}
		if a := testing.AllocsPerRun(1000, wait); a != 0 {
			t.Fatalf("%v allocations per timer event, want 0", a)
		}
		on(l, func() {
			tm.Stop()
			if fires < 1050 {
				t.Errorf("timer fired %d times", fires)
			}
		})
	})
}

// TestAllocsPerAddr: reading a connection's addresses allocates nothing
// (unix.Getsockname and Accept4 allocate a Sockaddr per call: garbage an
// idle connection's 1 KiB budget cannot afford).
func TestAllocsPerAddr(t *testing.T) {
	_, _, raw := loopbackConn(t)
	raw.Control(func(fd uintptr) {
		if a := testing.AllocsPerRun(1000, func() { LocalAddr(int(fd)); PeerAddr(int(fd)) }); a != 0 {
			t.Fatalf("%v allocations per LocalAddr+PeerAddr, want 0", a)
		}
	})
}
