//go:build !race

// Allocation tests (testing.AllocsPerRun). Their counts are meaningless
// under -race (the detector allocates, sync.Pool drops items), so this file
// is left out of the race run and `make test-alloc` runs it without -race.
// Every test here has "Alloc" in its name: that pass selects them by it.

package rlserver

import (
	"testing"

	"github.com/rl-tproxy/rl-tproxy/pkg/ratelimitly/wire"
)

// Decisions, replays and reports do not allocate in steady state (existing
// buckets and trackers, dedup ring wrapped).
func TestHandleZeroAllocs(t *testing.T) {
	f := newHandleFixture(t)
	rep := &wire.LatencyReport{Entries: []wire.ReportEntry{{Service: []byte("checkout"), DurationMs: 5}}}
	for i := 0; i < 2000; i++ { // warm up: create keys, wrap the dedup ring
		f.request(t)
		f.id++
		f.one(t, rep, f.id)
	}
	if a := testing.AllocsPerRun(500, func() { f.request(t) }); a != 0 {
		t.Errorf("decision: %v allocs", a)
	}
	if a := testing.AllocsPerRun(500, func() {
		if f.one(t, f.req, f.id) == 0 { // replay of the last id
			t.Fatal("no replay answer")
		}
	}); a != 0 {
		t.Errorf("replay: %v allocs", a)
	}
	if a := testing.AllocsPerRun(500, func() { f.id++; f.one(t, rep, f.id) }); a != 0 {
		t.Errorf("report: %v allocs", a)
	}
}
