//go:build !race

package topkeys

import (
	"testing"
	"time"
)

// The allow path and the deny path allocate nothing, also across the turn
// of a sub-window.
func TestAllowDenyAlloc(t *testing.T) {
	z := NewRegistry(Plain, nil).Zone("z")
	key := []byte("k:mallory")
	other := []byte("k:someone-else")
	i := 0
	n := testing.AllocsPerRun(1000, func() {
		i++
		ts := at(time.Duration(i) * 100 * time.Millisecond)
		z.Allow(key, ts)
		z.Deny(key, ts)
		z.Deny(other, ts)
	})
	if n != 0 {
		t.Fatalf("%v allocations per allow+deny", n)
	}
}
