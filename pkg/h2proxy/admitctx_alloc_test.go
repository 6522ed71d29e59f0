//go:build !race

package h2proxy

import (
	"context"
	"testing"
	"time"
)

// TestAllocsDeadlineCtx: an admission whose Hook decides without waiting
// (start, Err, finish) allocates nothing.
func TestAllocsDeadlineCtx(t *testing.T) {
	var c deadlineCtx
	parent, cancel := context.WithCancel(context.Background())
	defer cancel()
	if n := testing.AllocsPerRun(1000, func() {
		c.start(parent, time.Now().Add(time.Second))
		if c.Err() != nil {
			t.Fatal("ended")
		}
		c.finish()
	}); n != 0 {
		t.Fatalf("%v allocations per admission", n)
	}
}
