//go:build !race

// Allocation tests (testing.AllocsPerRun). Their counts are meaningless
// under -race (the detector allocates, sync.Pool drops items), so this file
// is left out of the race run and `make test-alloc` runs it without -race.
// Every test here has "Alloc" in its name: that pass selects them by it.

package metrics

import "testing"

// Incrementing a cause counter allocates nothing once it is cached.
func TestCauseCounterIncNoAlloc(t *testing.T) {
	m := New("t", "c")
	if n := testing.AllocsPerRun(100, func() { m.Cause("timeout").Inc() }); n != 0 {
		t.Fatalf("Cause().Inc allocates %v", n)
	}
}
