package evloop

import (
	"runtime"
	"testing"
	"time"

	"github.com/rl-tproxy/rl-tproxy/internal/testkit"
)

// TestKernelWaitsCountOnlyWaits: Stats.KernelWaits counts "waits in the
// system call with the loop's P held", so an iteration that chose the
// kernel wait (inKernel set) and then found a posted function (timeout
// forced to 0) must not count one: a chain of functions that each post
// the next (a flood's read continuation does this every turn) would count
// a "kernel wait" per turn while the loop never waits.
func TestKernelWaitsCountOnlyWaits(t *testing.T) {
	withKernelSpan(t, time.Hour)
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(2)) // a P to spare
	eachBackend(t, func(t *testing.T, be Backend) {
		g := startGroup(t, be, 1)
		l := g.Loops()[0]
		// Wake the loop out of its park (the span starts when a park ends)
		// until it waits in the kernel.
		testkit.WaitFor(t, "the loop to wait in the kernel", func() bool {
			if l.asleep.Load() && !l.inKernel.Load() {
				l.Post(func() {})
			}
			return l.inKernel.Load() && l.asleep.Load()
		})
		before := l.nKWaits.Load()
		const chain = 100
		done := make(chan struct{})
		var step func(k int)
		step = func(k int) {
			if k == chain {
				close(done)
				return
			}
			l.Post(func() { step(k + 1) }) // from the loop's own thread: no wake-up, no wait
		}
		l.Post(func() { step(0) })
		select {
		case <-done:
		case <-time.After(testkit.WaitBound):
			t.Fatal("the chain did not run")
		}
		// The kernel wait the first Post ended, and the next one: at most 2.
		if got := l.nKWaits.Load() - before; got > 2 {
			t.Fatalf("%d kernel waits counted for a chain of %d posted turns that never waited", got, chain)
		}
	})
}
