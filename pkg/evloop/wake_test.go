package evloop

import (
	"io"
	"net"
	"runtime"
	"slices"
	"testing"
	"time"

	"github.com/rl-tproxy/rl-tproxy/internal/testkit"
)

// TestParkedLoopWakesAtOnce: a loop parked in the netpoller is woken by
// its socket's data as directly as a goroutine blocked in a read is. Each
// round parks the loop (no kernel wait: every idle wait parks), then
// times one echo round trip through it, beside one through a goroutine
// echo server in this process (the netpoller's own wake-up, the same
// machine at the same moment). The loop's median must stay within 10x
// the goroutine's: a wake-up that waits for a deferred kernel callback
// (an io_uring ring signalling its registered eventfd from an RCU
// callback, 4-20 ms after the data arrived) is 40-200x it, a direct one
// 1-3x. The bound is ten times what the direct path takes, not a
// threshold on this machine's speed.
func TestParkedLoopWakesAtOnce(t *testing.T) {
	withKernelSpan(t, 0) // every idle wait parks
	eachBackend(t, func(t *testing.T, be Backend) {
		g := startGroup(t, be, 1)
		l := g.Loops()[0]
		fd, addr := listenFD(t)
		listenAll(t, g, fd, func() Handler { return &echo{limit: 64 << 10} })
		c := dial(t, addr)
		ref := goroutineEcho(t)
		const rounds = 31
		var viaLoop, viaGoroutine []time.Duration
		msg, buf := []byte("ping"), make([]byte, 4)
		trip := func(c net.Conn) time.Duration {
			t0 := time.Now()
			if _, err := c.Write(msg); err != nil {
				t.Fatal(err)
			}
			if _, err := io.ReadFull(c, buf); err != nil {
				t.Fatal(err)
			}
			return time.Since(t0)
		}
		trip(c) // the connection is accepted and armed
		parks := g.Stats().Parks
		for i := range rounds {
			// Asleep, not in a kernel wait: the loop is in (or entering)
			// its park in the netpoller.
			testkit.WaitFor(t, "the loop to park", func() bool { return l.asleep.Load() && !l.inKernel.Load() })
			viaLoop = append(viaLoop, trip(c))
			viaGoroutine = append(viaGoroutine, trip(ref))
			if i == 0 {
				viaLoop, viaGoroutine = viaLoop[:0], viaGoroutine[:0] // warm-up
			}
		}
		// Parks counts waits that slept: most rounds' data must have found
		// the loop asleep, or this measured something else.
		if n := g.Stats().Parks - parks; n < rounds/2 {
			t.Fatalf("the loop slept in %d of %d rounds", n, rounds)
		}
		slices.Sort(viaLoop)
		slices.Sort(viaGoroutine)
		loopMed, refMed := viaLoop[len(viaLoop)/2], viaGoroutine[len(viaGoroutine)/2]
		t.Logf("%s: echo through a parked loop p50 %v (max %v), through a goroutine p50 %v", be, loopMed, viaLoop[len(viaLoop)-1], refMed)
		if loopMed > 10*refMed {
			t.Fatalf("a parked loop woke late: median echo %v through the loop, %v through a goroutine (over 10x): its wake-up is not the socket's own",
				loopMed, refMed)
		}
	})
}

// goroutineEcho starts an echo server served by a goroutine (Go's
// netpoller) and returns a connection to it. The goroutine is locked to
// its thread as a loop's is, so its wake-up takes the same hand-off of
// the P to that thread.
func goroutineEcho(t *testing.T) net.Conn {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		s, err := ln.Accept()
		if err != nil {
			return
		}
		defer s.Close()
		// A read-write loop, not io.Copy: TCPConn.ReadFrom would splice
		// through a pipe the runtime keeps pooled past the test.
		b := make([]byte, 4096)
		for {
			n, err := s.Read(b)
			if err != nil {
				return
			}
			if _, err := s.Write(b[:n]); err != nil {
				return
			}
		}
	}()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}
