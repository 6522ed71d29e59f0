package rlserver

import (
	"math/rand/v2"
	"testing"
)

// dedupModel is the reference the table must agree with: per shard a ring
// of slots filled in order (an insert of a new id takes the next slot and
// evicts whatever it held, live or not), and a plain map from id to slot.
type dedupModel struct {
	per   int
	until map[dedupKey]int64
	ring  map[*dedupShard][]*dedupKey
	next  map[*dedupShard]int
}

func (m *dedupModel) insert(d *dedupTable, k dedupKey, until int64) {
	if _, ok := m.until[k]; ok {
		m.until[k] = until
		return
	}
	s, _ := d.shard(k)
	r := m.ring[s]
	if r == nil {
		r = make([]*dedupKey, m.per)
		m.ring[s] = r
	}
	i := m.next[s]
	m.next[s] = (i + 1) % m.per
	if old := r[i]; old != nil {
		delete(m.until, *old)
	}
	r[i] = &k
	m.until[k] = until
}

func (m *dedupModel) sweep(now int64) {
	for _, r := range m.ring {
		for i, k := range r {
			if k != nil && m.until[*k] < now {
				delete(m.until, *k)
				r[i] = nil
			}
		}
	}
}

// TestDedupTableAgreesWithModel drives the table and the model with the
// same random operations (inserts of fresh and repeated ids, lookups,
// sweeps; a ring small enough to wrap many times) and compares every
// lookup and the entry count.
func TestDedupTableAgreesWithModel(t *testing.T) {
	for _, tc := range []struct {
		name     string
		capacity int
		keys     int // distinct ids drawn from
		ops      int
	}{
		{"tiny ring, few ids", nShards, 200, 20000},
		{"tiny ring, many ids", nShards * 2, 100000, 20000},
		{"larger ring", nShards * 64, 5000, 50000},
		{"odd per-shard size", nShards * 7, 3000, 30000},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(1, uint64(tc.capacity)))
			d := newDedup(tc.capacity)
			m := &dedupModel{per: max(1, tc.capacity/nShards), until: map[dedupKey]int64{},
				ring: map[*dedupShard][]*dedupKey{}, next: map[*dedupShard]int{}}
			now := int64(1000)
			for i := 0; i < tc.ops; i++ {
				k := dedupKey{keyID: uint32(rng.IntN(3)), id: uint64(rng.IntN(tc.keys))}
				switch r := rng.IntN(100); {
				case r < 1:
					now += int64(rng.IntN(50))
					d.sweep(now)
					m.sweep(now)
				case r < 50:
					s, tag := d.shard(k)
					until := now + int64(rng.IntN(100)) - 20
					d.insert(s, k, tag, until, now)
					m.insert(d, k, until)
				default:
					s, tag := d.shard(k)
					got := d.lookup(s, k, tag, now) != nil
					u, ok := m.until[k]
					if want := ok && u >= now; got != want {
						t.Fatalf("op %d: lookup %v = %v, model %v (until %d, now %d)", i, k, got, want, u, now)
					}
				}
				if i%997 == 0 {
					if got, want := d.count.Load(), int64(len(m.until)); got != want {
						t.Fatalf("op %d: %d entries, model %d", i, got, want)
					}
				}
			}
		})
	}
}

// BenchmarkDedupInsert is the dedup work of one new request at the
// default capacity in steady state (the ring wrapped: every insert evicts
// the shard's oldest id): a lookup that misses, then an insert.
func BenchmarkDedupInsert(b *testing.B) {
	d := newDedup(DefaultDedupCapacity)
	rng := rand.New(rand.NewPCG(7, 7))
	now := int64(1)
	for range 2 * DefaultDedupCapacity {
		k := dedupKey{keyID: 1, id: rng.Uint64()}
		s, tag := d.shard(k)
		d.insert(s, k, tag, now+60_000, now)
	}
	b.ReportAllocs()
	for b.Loop() {
		k := dedupKey{keyID: 1, id: rng.Uint64()}
		s, tag := d.shard(k)
		if d.lookup(s, k, tag, now) != nil {
			b.Fatal("fresh id found")
		}
		d.insert(s, k, tag, now+60_000, now)
	}
}
