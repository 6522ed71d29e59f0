package rlclient

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"unsafe"
)

// The stripe count follows the threads that may check at once: four per
// thread, a power of two, within [minStripes, maxStripes]; a stripe's
// header fills one cache line.
func TestStripesFor(t *testing.T) {
	for _, c := range []struct{ procs, want int }{{0, 4}, {1, 4}, {2, 8}, {3, 16}, {4, 16}, {5, 32}, {16, 64}, {1000, 64}} {
		if got := stripesFor(c.procs); got != c.want {
			t.Errorf("stripesFor(%d) = %d, want %d", c.procs, got, c.want)
		}
	}
	if sz := unsafe.Sizeof(tableStripe{}); sz != 64 {
		t.Errorf("tableStripe is %d bytes, want one 64-byte line", sz)
	}
	var tb reqTable
	tb.init(8)
	for i := range tb.stripes {
		if s := &tb.stripes[i]; s.shift != stripeShift+3 || len(s.slots) != stripeSlots {
			t.Fatalf("stripe %d: shift %d, %d slots", i, s.shift, len(s.slots))
		}
	}
}

// TestReqTableAgreesWithModel drives the table and a map with the same
// random puts, removes and lookups, ids crowded into few stripes and few
// home slots (so clusters form, wrap around the end and grow the
// stripes), and compares every lookup and, at the end, the live set.
func TestReqTableAgreesWithModel(t *testing.T) {
	for _, stripes := range []int{minStripes, maxStripes} {
		t.Run(fmt.Sprintf("%d stripes", stripes), func(t *testing.T) { reqTableAgreesWithModel(t, stripes) })
	}
}

func reqTableAgreesWithModel(t *testing.T, stripes int) {
	for _, tc := range []struct {
		name   string
		idBits uint // random bits above the token bits
		ops    int
	}{
		{"one stripe, clustered homes", 3, 20000}, // stripe bits only: every id in few stripes, home 0
		{"few stripes, some homes", 10, 20000},    // 4 home bits
		{"spread", 58, 50000},                     // what real ids look like
		{"growth", 14, 100000},                    // up to 256 live per stripe
	} {
		t.Run(tc.name, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(3, uint64(tc.idBits)))
			var tb reqTable
			tb.init(stripes)
			model := map[uint64]*request{}
			id := func() uint64 { return (rng.Uint64() & (1<<tc.idBits - 1)) << stripeShift }
			for i := range tc.ops {
				k := id()
				switch r := rng.IntN(10); {
				case r < 4:
					q := &request{id: k}
					tb.put(q)
					model[k] = q
				case r < 7:
					tb.remove(k)
					delete(model, k)
				default:
					if got, want := tb.get(k), model[k]; got != want {
						t.Fatalf("op %d: get(%#x) = %p, model %p", i, k, got, want)
					}
				}
			}
			n := 0
			for i := range tb.stripes {
				s := &tb.stripes[i]
				s.each(func(r *request) {
					n++
					if model[r.id] != r {
						t.Errorf("table holds %#x, model does not", r.id)
					}
				})
				c := 0
				s.each(func(*request) { c++ })
				if c != s.n {
					t.Errorf("stripe %d: %d entries, count %d", i, c, s.n)
				}
			}
			if n != len(model) {
				t.Fatalf("%d live, model %d", n, len(model))
			}
		})
	}
}

// BenchmarkReqTable is a check's table work: put at the start, get for
// its answer, remove at the end, with 256 others in flight, at the fewest
// and the most stripes. (In the proxy the difference is the cache: between
// two checks on one loop thread, the TCP work evicts the lines of a table
// spread over 64 stripes; here every line stays hot.)
func BenchmarkReqTable(b *testing.B) {
	for _, stripes := range []int{minStripes, maxStripes} {
		b.Run(fmt.Sprintf("stripes=%d", stripes), func(b *testing.B) { benchReqTable(b, stripes) })
	}
}

func benchReqTable(b *testing.B, stripes int) {
	var tb reqTable
	tb.init(stripes)
	rng := rand.New(rand.NewPCG(1, 2))
	live := make([]*request, 256)
	for i := range live {
		live[i] = &request{id: rng.Uint64() &^ tokenMask}
		tb.put(live[i])
	}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		r := live[i%len(live)]
		tb.remove(r.id)
		r.id = rng.Uint64() &^ tokenMask
		tb.put(r)
		if tb.get(r.id) != r {
			b.Fatal("lost")
		}
		i++
	}
}
