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
// buckets and trackers).
func TestHandleZeroAllocs(t *testing.T) {
	f := newHandleFixture(t)
	rep := &wire.LatencyReport{Entries: []wire.ReportEntry{{Service: []byte("checkout"), DurationMs: 5}}}
	for i := 0; i < 2000; i++ { // warm up: create keys
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

// Filling a fresh dedup ring does not allocate: the bodies of typical
// answers live in the slots (before, each slot's first use allocated its
// body, so a server allocated for its first DefaultDedupCapacity requests).
func TestDedupFillZeroAllocs(t *testing.T) {
	d := newDedup(DefaultDedupCapacity)
	id := uint64(0)
	body := make([]byte, inlineBody)
	if a := testing.AllocsPerRun(5000, func() {
		id++
		k := dedupKey{keyID: 1, id: id}
		s, tag := d.shard(k)
		s.setBody(d.insert(s, k, tag, 60_000, 1), body)
	}); a != 0 {
		t.Errorf("insert into a fresh ring: %v allocs", a)
	}
	if got := d.count.Load(); got != 5001 {
		t.Fatalf("%d entries after 5001 inserts", got)
	}
}

// A driven socket's serve turn (read, decide, seal, send) does not
// allocate in steady state.
func TestDrivenServeZeroAllocs(t *testing.T) {
	clk := newClock()
	s := startServer(t, clk, func(cfg *Config) { cfg.Workers, cfg.Driven, cfg.DedupCapacity = 1, true, 256 })
	k := s.Sockets()[0]
	if err := k.Attach(); err != nil {
		t.Fatal(err)
	}
	defer k.Detach()
	c := newClient(t, s, clk, testCred("acme", 1, 1))
	const warm, runs = 2000, 500
	pkts := make([][]byte, 0, warm+runs+1)
	r := oneRes(res("b", 1_000_000, 1000, 1_000_000, 1))
	for i := 0; i < cap(pkts); i++ { // sealed up front: the test client allocates
		h := c.header(uint64(1 + i))
		pkts = append(pkts, c.seal(&h, r))
	}
	buf := make([]byte, 2048)
	next := 0
	turn := func() {
		if _, err := c.conn.Write(pkts[next]); err != nil {
			t.Fatal(err)
		}
		next++
		if k.Serve(1) {
			t.Fatal("more after one datagram")
		}
		if _, err := c.conn.Read(buf); err != nil {
			t.Fatal(err)
		}
	}
	for i := 0; i < warm; i++ { // buckets exist, the dedup ring wrapped
		turn()
	}
	before := s.Stats().Responses
	if a := testing.AllocsPerRun(runs, turn); a != 0 {
		t.Errorf("driven serve turn: %v allocs", a)
	}
	if got := s.Stats().Responses - before; got != runs+1 {
		t.Fatalf("%d answers in the measured turns", got)
	}
}
