//go:build !race

package exchange

import (
	"context"
	"testing"
	"time"
)

// TestAllocsAdmitContext: an admission whose Hook decides without waiting
// (start, Err, finish) allocates nothing.
func TestAllocsAdmitContext(t *testing.T) {
	var c AdmitContext
	parent, cancel := context.WithCancel(context.Background())
	defer cancel()
	if n := testing.AllocsPerRun(1000, func() {
		c.Start(parent, time.Now().Add(time.Second))
		if c.Err() != nil {
			t.Fatal("ended")
		}
		c.Finish()
	}); n != 0 {
		t.Fatalf("%v allocations per admission", n)
	}
}
