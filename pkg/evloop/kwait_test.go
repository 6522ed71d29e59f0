package evloop

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rl-tproxy/rl-tproxy/internal/testkit"
)

// withKernelSpan sets kernelSpan for one test (before its loops start).
func withKernelSpan(t *testing.T, d time.Duration) {
	old := kernelSpan
	kernelSpan = int64(d)
	t.Cleanup(func() { kernelSpan = old })
}

// TestKernelWaitWakes: a loop that waits in the kernel (the span made
// endless, so no timeout can hide a lost wake-up) is woken by its
// sockets and by a Post from another goroutine.
func TestKernelWaitWakes(t *testing.T) {
	withKernelSpan(t, time.Hour)
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(2)) // a P to spare
	eachBackend(t, func(t *testing.T, be Backend) {
		g := startGroup(t, be, 1)
		fd, addr := listenFD(t)
		listenAll(t, g, fd, func() Handler { return &echo{limit: 64 << 10} })
		c := dial(t, addr)
		for i := range 50 {
			if err := echoOnce(c, []byte("ping")); err != nil {
				t.Fatalf("round trip %d: %v", i, err)
			}
		}
		st := g.Stats()
		if st.KernelWaits == 0 {
			t.Fatalf("stats %+v: no kernel wait with traffic after the first park", st)
		}
		l := g.Loops()[0]
		woken := 0
		for i := 0; woken < 20; i++ {
			if i == 200 {
				t.Fatalf("only %d of 200 posts found the loop asleep", woken)
			}
			// Post only once the loop is (about to be) in its kernel wait
			// with nothing queued: only the Post's wake-up can end it.
			testkit.WaitFor(t, "the loop to wait in the kernel", func() bool { return l.inKernel.Load() && l.asleep.Load() })
			wakes, sent := l.nWakes.Load(), l.nPostWk.Load()
			posted := make(chan struct{})
			l.Post(func() { close(posted) })
			select {
			case <-posted:
			case <-time.After(30 * time.Second):
				t.Fatalf("post %d: not run in 30 s: the wake-up did not reach the kernel wait", i)
			}
			// The wait can end before the Post for another reason (the
			// runtime's preemption signal ends a wait that holds a P for
			// 10 ms); the Post then finds the loop awake and sends no
			// wake-up. When it sent one, the loop must read that one.
			if l.nPostWk.Load() == sent {
				continue
			}
			woken++
			testkit.WaitFor(t, "the post's wake-up read by the loop", func() bool { return l.nWakes.Load() > wakes })
			if err := echoOnce(c, []byte("pong")); err != nil {
				t.Fatalf("round trip after post %d: %v", i, err)
			}
		}
		if got := g.Stats().Parks; got != st.Parks {
			t.Fatalf("%d parks while the span was endless, want %d (only the first)", got, st.Parks)
		}
	})
}

// TestKernelWaitNeedsSpareP: a loop waits in the kernel, holding its P,
// only while the process has a P that no loop holds, on either backend;
// with GOMAXPROCS equal to the number of loops it always parks (the test's own client
// goroutine shares the loop's P). With a spare P it waits in the kernel
// between round trips and, once idle for longer than kernelSpan, parks.
func TestKernelWaitNeedsSpareP(t *testing.T) {
	withKernelSpan(t, 200*time.Microsecond)
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(0))
	for _, tc := range []struct {
		procs  int
		kernel bool
	}{{1, false}, {2, true}} {
		t.Run(fmt.Sprintf("GOMAXPROCS=%d", tc.procs), func(t *testing.T) {
			runtime.GOMAXPROCS(tc.procs)
			eachBackend(t, func(t *testing.T, be Backend) {
				g := startGroup(t, be, 1)
				fd, addr := listenFD(t)
				listenAll(t, g, fd, func() Handler { return &echo{limit: 64 << 10} })
				c := dial(t, addr)
				for i := range 300 {
					if err := echoOnce(c, []byte("ping")); err != nil {
						t.Fatalf("round trip %d: %v", i, err)
					}
				}
				st := g.Stats()
				if (st.KernelWaits > 0) != tc.kernel {
					t.Fatalf("stats %+v: want kernel waits %v", st, tc.kernel)
				}
				// Idle, every loop parks. A park is counted when it ends
				// after sleeping: one more round trip ends it. (Counting
				// parks during the round trips raced: on io_uring with a
				// spare P a park comes only after kernelSpan without one,
				// and its first check then finds the last send's
				// completion, so on a quick machine none slept.)
				testkit.WaitFor(t, "the idle loop to park", func() bool { return strings.HasPrefix(loopWaitState(), "IO wait") })
				if err := echoOnce(c, []byte("ping")); err != nil {
					t.Fatalf("round trip after the park: %v", err)
				}
				testkit.WaitFor(t, "the park counted", func() bool { return g.Stats().Parks > st.Parks })
			})
		})
	}
}

// echoOnce writes data on the kept-open c and reads it back.
func echoOnce(c net.Conn, data []byte) error {
	if _, err := c.Write(data); err != nil {
		return fmt.Errorf("write: %w", err)
	}
	got := make([]byte, len(data))
	if _, err := io.ReadFull(c, got); err != nil {
		return fmt.Errorf("read: %w", err)
	}
	if !bytes.Equal(got, data) {
		return fmt.Errorf("echoed %q, sent %q", got, data)
	}
	return nil
}

// TestKernelWaitHoldP: without a spare P (GOMAXPROCS=1, one loop) a
// loop waits in the kernel while Config.HoldP says no goroutine
// needs a P, and parks on every wait once it says one does (the test's
// own client goroutine shares the loop's P, so each round trip also
// shows that such a goroutine still runs: at the latest when the span
// ends and the loop parks).
func TestKernelWaitHoldP(t *testing.T) {
	withKernelSpan(t, 200*time.Microsecond)
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	eachBackend(t, testKernelWaitHoldP)
}

func testKernelWaitHoldP(t *testing.T, be Backend) {
	var hold atomic.Bool
	hold.Store(true)
	g, err := Start(Config{Loops: 1, Backend: be, Logger: quietLogger(), BufSize: 4096, HoldP: func(*Loop) bool { return hold.Load() }})
	if err != nil {
		t.Fatalf("start %s: %v", be, err)
	}
	t.Cleanup(func() {
		if err := g.Close(); err != nil {
			t.Errorf("close group: %v", err)
		}
	})
	fd, addr := listenFD(t)
	listenAll(t, g, fd, func() Handler { return &echo{limit: 64 << 10} })
	c := dial(t, addr)
	trips := func(n int) {
		for i := range n {
			if err := echoOnce(c, []byte("ping")); err != nil {
				t.Fatalf("round trip %d: %v", i, err)
			}
		}
	}
	trips(200)
	st := g.Stats()
	if st.KernelWaits == 0 {
		t.Fatalf("stats %+v: no kernel wait while HoldP said no goroutine needs a P", st)
	}
	hold.Store(false)
	trips(1) // the wait in progress may still be a kernel one
	st = g.Stats()
	trips(200)
	if got := g.Stats(); got.KernelWaits != st.KernelWaits || got.Parks == st.Parks {
		t.Fatalf("after HoldP turned false: kernel waits %d -> %d, parks %d -> %d; want no new kernel wait, new parks",
			st.KernelWaits, got.KernelWaits, st.Parks, got.Parks)
	}
}

// spanLoop starts one io_uring loop with a P to spare and the given
// kernel span, serving an echo; it returns the loop and a connection
// after trips round trips.
func spanLoop(t *testing.T, span time.Duration, trips int) (*Group, *Loop, net.Conn) {
	t.Helper()
	withKernelSpan(t, span)
	prev := runtime.GOMAXPROCS(2) // a P to spare
	t.Cleanup(func() { runtime.GOMAXPROCS(prev) })
	if err := probeUring(); err != nil {
		testkit.Missing(t, "io_uring refused on this machine: %v", err)
	}
	g := startGroup(t, IOUring, 1)
	fd, addr := listenFD(t)
	listenAll(t, g, fd, func() Handler { return &echo{limit: 64 << 10} })
	c := dial(t, addr)
	for i := range trips {
		if err := echoOnce(c, []byte("ping")); err != nil {
			t.Fatalf("round trip %d: %v", i, err)
		}
	}
	return g, g.Loops()[0], c
}

// TestKernelWaitSpanTimeout: a span of kernel waits is bounded by one
// TIMEOUT armed when it begins, not by a timeout on each wait (an
// enter's timeout arms a kernel timer and cancels it on the wake-up:
// on a virtual machine two exits per wait, docs/bench/evloop.md); a
// loop timer due before the span ends still bounds the wait it falls in.
func TestKernelWaitSpanTimeout(t *testing.T) {
	_, l, _ := spanLoop(t, time.Hour, 200)
	waits := l.nKWaits.Load()
	if waits < 100 {
		t.Fatalf("%d kernel waits for 200 round trips after the first park, want one per trip at least", waits)
	}
	if n := l.ur.nSpans.Load(); n != 1 {
		t.Fatalf("%d span TIMEOUTs armed in one span, want 1", n)
	}
	if n := l.nKTimed.Load(); n != 0 {
		t.Fatalf("%d of %d kernel waits had a timeout of their own, want none (no loop timer was armed)", n, waits)
	}

	// A timer due within the span bounds the wait it falls in.
	testkit.WaitFor(t, "the loop to wait in the kernel", func() bool { return l.inKernel.Load() && l.asleep.Load() })
	fired := make(chan struct{})
	var tm Timer
	l.Post(func() {
		tm.Init(l, func() { close(fired) })
		tm.Reset(l.Now() + int64(5*time.Millisecond))
	})
	select {
	case <-fired:
	case <-time.After(30 * time.Second):
		t.Fatal("a timer 5 ms ahead did not fire in 30 s during an hour's span")
	}
	if l.nKTimed.Load() == 0 {
		t.Fatal("the timer fired, but no kernel wait was bounded by it (a signal or a spurious wake-up ended the wait)")
	}
	if n := l.ur.nSpans.Load(); n != 1 {
		t.Fatalf("%d span TIMEOUTs armed, want still 1", n)
	}
}

// TestKernelWaitSpanEnds: the span's TIMEOUT completes, so an idle loop
// leaves its kernel wait and parks (without it only the runtime's
// preemption signal would end the wait, 10 ms later).
func TestKernelWaitSpanEnds(t *testing.T) {
	g, l, c := spanLoop(t, 200*time.Microsecond, 0)
	for round := range 3 {
		for i := range 100 {
			if err := echoOnce(c, []byte("ping")); err != nil {
				t.Fatalf("round %d, trip %d: %v", round, i, err)
			}
		}
		testkit.WaitFor(t, "every span TIMEOUT armed to complete", func() bool {
			return l.ur.nSpans.Load() > 0 && l.ur.nEnds.Load() == l.ur.nSpans.Load()
		})
		testkit.WaitFor(t, "the idle loop to park", func() bool { return strings.HasPrefix(loopWaitState(), "IO wait") })
	}
	if l.nKWaits.Load() == 0 {
		t.Fatalf("stats %+v: no kernel wait", g.Stats())
	}
}

// TestKernelWaitSpanRefused: a kernel that refuses the span's TIMEOUT
// (here an invalid one) is asked once; the loop's waits then bound
// themselves, and traffic flows (a wait armed a refused TIMEOUT before
// each, each would end at once: a busy loop).
func TestKernelWaitSpanRefused(t *testing.T) {
	refuseSpanTimeout = true
	t.Cleanup(func() { refuseSpanTimeout = false })
	g, l, _ := spanLoop(t, time.Hour, 100)
	if n := l.ur.nSpans.Load(); n != 1 {
		t.Fatalf("%d TIMEOUTs armed after the kernel refused the first, want 1", n)
	}
	if l.nKTimed.Load() == 0 {
		t.Fatalf("stats %+v: no kernel wait bounded by its own timeout after the refusal", g.Stats())
	}
}
