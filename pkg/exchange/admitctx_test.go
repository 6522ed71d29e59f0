package exchange

import (
	"context"
	"errors"
	"testing"
	"time"
)

type ctxKey struct{}

// TestAdmitContext: the reused admission context ends at its deadline
// (waited on, or only asked), with its parent (the stream's context), and
// a later admission on the same context is not ended by the previous
// one's timer or parent.
func TestAdmitContext(t *testing.T) {
	bound := func(t *testing.T, ch <-chan struct{}, what string) {
		t.Helper()
		select {
		case <-ch:
		case <-time.After(10 * time.Second):
			t.Fatalf("%s: Done not closed", what)
		}
	}
	t.Run("deadline, waited on", func(t *testing.T) {
		var c AdmitContext
		parent := context.WithValue(context.Background(), ctxKey{}, "v")
		c.Start(parent, time.Now().Add(20*time.Millisecond))
		if c.Err() != nil || c.Value(ctxKey{}) != "v" {
			t.Fatalf("fresh: Err %v, Value %v", c.Err(), c.Value(ctxKey{}))
		}
		bound(t, c.Done(), "deadline")
		if !errors.Is(c.Err(), context.DeadlineExceeded) {
			t.Fatalf("Err %v", c.Err())
		}
		c.Finish()
	})
	t.Run("deadline passed, only asked", func(t *testing.T) {
		var c AdmitContext
		c.Start(context.Background(), time.Now().Add(-time.Millisecond))
		if !errors.Is(c.Err(), context.DeadlineExceeded) {
			t.Fatalf("Err %v", c.Err())
		}
		bound(t, c.Done(), "Done after Err") // closed at once
		c.Finish()
	})
	t.Run("parent cancelled", func(t *testing.T) {
		var c AdmitContext
		parent, cancel := context.WithCancel(context.Background())
		c.Start(parent, time.Now().Add(time.Hour))
		done := c.Done()
		cancel()
		bound(t, done, "parent cancel")
		if !errors.Is(c.Err(), context.Canceled) {
			t.Fatalf("Err %v", c.Err())
		}
		c.Finish()
	})
	t.Run("cancelled by its owner", func(t *testing.T) {
		var c AdmitContext
		c.Start(context.Background(), time.Now().Add(time.Hour))
		if d, ok := c.Deadline(); !ok || time.Until(d) < 59*time.Minute {
			t.Fatalf("Deadline %v %v", d, ok)
		}
		if c.Value(ctxKey{}) != nil {
			t.Fatal("Value without a parent")
		}
		done := c.Done()
		c.Cancel(context.Canceled)
		c.Cancel(context.DeadlineExceeded) // the first error stays
		bound(t, done, "Cancel")
		if !errors.Is(c.Err(), context.Canceled) {
			t.Fatalf("Err %v", c.Err())
		}
		c.Finish()
		c.Start(context.Background(), time.Now().Add(time.Hour))
		if c.Err() != nil {
			t.Fatalf("started again: Err %v", c.Err())
		}
		c.Finish()
	})
	t.Run("zero value", func(t *testing.T) {
		var c AdmitContext
		if _, ok := c.Deadline(); ok {
			t.Fatal("a deadline before Start")
		}
		if !errors.Is(c.Err(), context.Canceled) {
			t.Fatalf("Err %v before Start", c.Err())
		}
	})
	t.Run("reuse", func(t *testing.T) {
		var c AdmitContext
		p1, cancel1 := context.WithCancel(context.Background())
		c.Start(p1, time.Now().Add(time.Millisecond))
		c.Done() // armed: timer and parent watch
		c.Finish()
		cancel1() // the old parent ends after finish
		c.Start(context.Background(), time.Now().Add(time.Hour))
		done := c.Done()
		// The first admission's timer and parent callbacks, had they
		// been running when finish stopped them, run now: the second
		// admission must stay live.
		c.expire()
		c.cancelParent()
		select {
		case <-done:
			t.Fatalf("second admission ended: %v", c.Err())
		default:
		}
		if c.Err() != nil {
			t.Fatalf("second admission: Err %v", c.Err())
		}
		c.Finish()
	})
}

// TestAdmitContextEndedBeforeDone: Done asked first on an admission whose
// parent already ended (a client that reset its stream at once) or whose
// deadline already passed returns a closed channel, closed once: the
// channel made by Done is not closed by the check and again by Done.
func TestAdmitContextEndedBeforeDone(t *testing.T) {
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	for _, tc := range []struct {
		name     string
		parent   context.Context
		deadline time.Time
		want     error
	}{
		{"parent ended", cancelled, time.Now().Add(time.Hour), context.Canceled},
		{"deadline passed", context.Background(), time.Now().Add(-time.Millisecond), context.DeadlineExceeded},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var c AdmitContext
			c.Start(tc.parent, tc.deadline)
			done := c.Done() // the first call of anything on c
			select {
			case <-done:
			default:
				t.Fatal("Done not closed")
			}
			if c.Done() != done {
				t.Fatal("a second Done returned another channel")
			}
			if !errors.Is(c.Err(), tc.want) {
				t.Fatalf("Err %v, want %v", c.Err(), tc.want)
			}
			c.Finish()
		})
	}
}
