package topkeys

import (
	"fmt"
	"hash/maphash"
	"math/rand/v2"
	"strings"
	"testing"
)

// The Space-Saving guarantees hold on skewed and uniform streams: every
// key counted more than N/k times is held, and for every held key
// Count−Err ≤ true ≤ Count with Err ≤ N/k.
func TestSpaceSavingBounds(t *testing.T) {
	seed := maphash.MakeSeed()
	for _, tc := range []struct {
		name  string
		k     int
		keys  int
		n     int
		heavy int // every heavy-th addition goes to "heavy"
	}{
		{"fits", 8, 5, 1000, 0},
		{"skewed", 16, 1000, 20000, 3},
		{"uniform", 16, 100, 20000, 0},
		{"one counter", 1, 50, 500, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(1, uint64(tc.k)))
			s := New(tc.k)
			exact := map[string]uint64{}
			for i := 0; i < tc.n; i++ {
				k := fmt.Sprintf("key-%d", rng.IntN(tc.keys))
				if tc.heavy > 0 && i%tc.heavy == 0 {
					k = "heavy"
				}
				exact[k]++
				s.Add(maphash.String(seed, k), []byte(k))
			}
			if s.Total() != uint64(tc.n) {
				t.Fatalf("total %d, want %d", s.Total(), tc.n)
			}
			bound := uint64(tc.n / tc.k)
			held := map[string]Counter{}
			s.Each(func(_ uint64, c Counter) { held[c.Key] = c })
			for k, c := range held {
				if tr := exact[k]; c.Count < tr || c.Count-c.Err > tr || c.Err > bound {
					t.Errorf("%s: count %d err %d, true %d, bound %d", k, c.Count, c.Err, tr, bound)
				}
			}
			for k, tr := range exact {
				if _, ok := held[k]; !ok && tr > bound {
					t.Errorf("%s (true %d > N/k %d) not held", k, tr, bound)
				}
				if _, ok := held[k]; !ok && tr > s.Min() {
					t.Errorf("%s absent with %d > min %d", k, tr, s.Min())
				}
			}
			if tc.heavy > 0 && tc.n/tc.heavy > tc.n/tc.k { // guaranteed only above N/k
				if c, ok := held["heavy"]; !ok || c.Count-c.Err < uint64(tc.n/tc.heavy) {
					t.Errorf("heavy hitter %v (held %v)", c, ok)
				}
			}
		})
	}
}

// Keys longer than MaxKeyLen are told apart by hash and length and come
// back cut with Truncated set.
func TestSpaceSavingLongKeys(t *testing.T) {
	seed := maphash.MakeSeed()
	s := New(4)
	a := strings.Repeat("a", 1024)
	b := strings.Repeat("a", 1023) + "b" // same first MaxKeyLen bytes
	for range 3 {
		s.Add(maphash.String(seed, a), []byte(a))
	}
	s.Add(maphash.String(seed, b), []byte(b))
	var got []Counter
	s.Each(func(_ uint64, c Counter) { got = append(got, c) })
	if len(got) != 2 {
		t.Fatalf("%d keys, want 2: %v", len(got), got)
	}
	for _, c := range got {
		if !c.Truncated || len(c.Key) != MaxKeyLen {
			t.Errorf("key of %d bytes, truncated %v", len(c.Key), c.Truncated)
		}
	}
	if got[0].Count+got[1].Count != 4 || (got[0].Count != 3 && got[1].Count != 3) {
		t.Errorf("counts %v", got)
	}
	s.Add(1, nil) // the empty key is a key like any other
	s.Reset()
	if s.Total() != 0 || s.Full() {
		t.Fatal("reset kept state")
	}
}
