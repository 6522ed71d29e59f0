package evloop

import (
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestOnTurnEndRemove: a removed turn-end function no longer runs (from
// the next turn-end on; a second remove does nothing), one that removes
// itself while the list runs ran once, and the others keep running.
func TestOnTurnEndRemove(t *testing.T) {
	eachBackend(t, func(t *testing.T, be Backend) {
		g := startGroup(t, be, 1)
		l := g.Loops()[0]
		var n1, n2, n3 int // loop thread only
		var r1 func()
		on := func(fn func()) {
			t.Helper()
			done := make(chan struct{})
			l.Post(func() { fn(); close(done) })
			select {
			case <-done:
			case <-time.After(10 * time.Second):
				t.Fatal("the loop did not run a posted function")
			}
		}
		on(func() {
			r1 = l.OnTurnEnd(func() { n1++ })
			l.OnTurnEnd(func() { n2++ })
			var r3 func()
			r3 = l.OnTurnEnd(func() { n3++; r3() })
		})
		on(func() {}) // at least one more turn end
		var at1, at2 int
		on(func() { r1(); r1(); at1, at2 = n1, n2 })
		for range 3 {
			on(func() {})
		}
		on(func() {
			if n1 != at1 {
				t.Errorf("removed function ran %d more times", n1-at1)
			}
			if n2 <= at2 {
				t.Errorf("kept function stopped running (%d, was %d)", n2, at2)
			}
			if n3 != 1 {
				t.Errorf("self-removing function ran %d times, want 1", n3)
			}
		})
	})
}

// TestWatchSlotsReused: watches that come and go (a RateLimitly client's
// sockets on every reload and rebind) reuse their slots instead of
// growing the loop's table, and each new watch gets its own events.
func TestWatchSlotsReused(t *testing.T) {
	eachBackend(t, func(t *testing.T, be Backend) {
		g := startGroup(t, be, 1)
		l := g.Loops()[0]
		on := func(fn func()) {
			t.Helper()
			done := make(chan struct{})
			l.Post(func() { fn(); close(done) })
			select {
			case <-done:
			case <-time.After(10 * time.Second):
				t.Fatal("the loop did not run a posted function")
			}
		}
		for i := range 50 {
			var fds [2]int
			if err := unix.Pipe2(fds[:], unix.O_NONBLOCK|unix.O_CLOEXEC); err != nil {
				t.Fatal(err)
			}
			fired := make(chan struct{}, 1)
			var w *Watch
			on(func() {
				var err error
				w, err = l.Watch(fds[0], func() {
					select {
					case fired <- struct{}{}:
					default:
					}
				})
				if err != nil {
					t.Error(err)
				}
			})
			if _, err := unix.Write(fds[1], []byte{1}); err != nil {
				t.Fatal(err)
			}
			select {
			case <-fired:
			case <-time.After(10 * time.Second):
				t.Fatalf("watch %d got no event", i)
			}
			on(func() { w.Stop() })
			unix.Close(fds[0])
			unix.Close(fds[1])
		}
		on(func() {
			if n := len(l.watches); n > 2 {
				t.Errorf("50 watches, one at a time, left a table of %d slots", n)
			}
		})
	})
}
