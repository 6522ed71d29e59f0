package rlserver

import (
	"bytes"
	"math/rand/v2"
	"testing"
	"unsafe"
)

// dedupModel is the reference the table must agree with: per shard a
// queue of ids in the order they came (a new id joins the back and, with
// the queue at capacity, pushes the front one out, live or not; a sweep
// drops ids from the front while they are expired), and plain maps from
// id to expiry and body.
type dedupModel struct {
	per   int
	until map[dedupKey]int64
	body  map[dedupKey][]byte
	queue map[*dedupShard][]dedupKey
}

func (m *dedupModel) insert(d *dedupTable, k dedupKey, until int64, body []byte) {
	m.body[k] = body
	if _, ok := m.until[k]; ok {
		m.until[k] = until
		return
	}
	s, _ := d.shard(k)
	q := m.queue[s]
	if len(q) == m.per {
		m.forget(q[0])
		q = q[1:]
	}
	m.queue[s] = append(q, k)
	m.until[k] = until
}

func (m *dedupModel) forget(k dedupKey) {
	delete(m.until, k)
	delete(m.body, k)
}

func (m *dedupModel) sweep(now int64) {
	for s, q := range m.queue {
		for len(q) > 0 && m.until[q[0]] < now {
			m.forget(q[0])
			q = q[1:]
		}
		m.queue[s] = q
	}
}

// TestDedupTableAgreesWithModel drives the table and the model with the
// same random operations (inserts of fresh and repeated ids with bodies
// empty, inline and longer than inlineBody, lookups, sweeps; a ring small
// enough to wrap many times) and compares every lookup, its body, and the
// entry count.
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
				body: map[dedupKey][]byte{}, queue: map[*dedupShard][]dedupKey{}}
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
					body := randBody(rng)
					s.setBody(d.insert(s, k, tag, until, now), body)
					m.insert(d, k, until, body)
				default:
					s, tag := d.shard(k)
					j := d.lookup(s, k, tag, now)
					u, ok := m.until[k]
					if want := ok && u >= now; (j >= 0) != want {
						t.Fatalf("op %d: lookup %v = %v, model %v (until %d, now %d)", i, k, j >= 0, want, u, now)
					}
					if j >= 0 && !bytes.Equal(s.body(j), m.body[k]) {
						t.Fatalf("op %d: body of %v is %d bytes %x, model %d bytes %x", i, k, len(s.body(j)), s.body(j), len(m.body[k]), m.body[k])
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

// DedupBytesPerID, which ratelimitly-server's --help quotes, is the slot
// plus two index cells per id at a power-of-two capacity.
func TestDedupBytesPerID(t *testing.T) {
	if got := int(unsafe.Sizeof(dedupSlot{})) + 2*8; got != DedupBytesPerID {
		t.Fatalf("slot %d bytes + 16 of index = %d, DedupBytesPerID %d", unsafe.Sizeof(dedupSlot{}), got, DedupBytesPerID)
	}
	for _, c := range []struct{ in, want int }{{1, 64}, {64, 64}, {100, 64}, {4100, 4096}, {DefaultDedupCapacity, DefaultDedupCapacity}} {
		if got := newDedup(c.in).capacity(); got != c.want {
			t.Errorf("capacity %d holds %d ids, want %d", c.in, got, c.want)
		}
	}
}

// randBody is a body for the model test: empty (a report's), inline, at
// the inline bound, or longer (up to a response with 32 guards and 32
// resources), with bytes that tell bodies apart.
func randBody(rng *rand.Rand) []byte {
	var n int
	switch r := rng.IntN(10); {
	case r < 2:
		return nil
	case r < 6:
		n = 1 + rng.IntN(inlineBody)
	case r < 7:
		n = inlineBody
	default:
		n = inlineBody + 1 + rng.IntN(556-inlineBody)
	}
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(rng.Uint32())
	}
	return b
}

// TestDedupLargeBodies: a slot whose body moves between the large map and
// the slot, and a sweep, leave no large body behind for a slot that no
// longer holds one.
func TestDedupLargeBodies(t *testing.T) {
	d := newDedup(nShards)
	k := dedupKey{keyID: 1, id: 42}
	s, tag := d.shard(k)
	big := bytes.Repeat([]byte{7}, inlineBody+1)
	i := d.insert(s, k, tag, 100, 0)
	s.setBody(i, big)
	if !bytes.Equal(s.body(i), big) || len(s.large) != 1 {
		t.Fatalf("large body: %d bytes back, %d large", len(s.body(i)), len(s.large))
	}
	s.setBody(i, []byte("short"))
	if string(s.body(i)) != "short" || len(s.large) != 0 {
		t.Fatalf("short after large: %q, %d large", s.body(i), len(s.large))
	}
	s.setBody(i, big)
	if j := d.insert(s, k, tag, 200, 150); j != i || len(s.body(j)) != 0 || len(s.large) != 0 {
		t.Fatalf("re-insert of an expired id: slot %d (was %d), %d-byte body, %d large", j, i, len(s.body(j)), len(s.large))
	}
	s.setBody(i, big)
	d.sweep(300)
	if len(s.large) != 0 || d.count.Load() != 0 {
		t.Fatalf("after the sweep: %d large, %d entries", len(s.large), d.count.Load())
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
		s.setBody(d.insert(s, k, tag, now+60_000, now), body24)
	}
	b.ReportAllocs()
	for b.Loop() {
		k := dedupKey{keyID: 1, id: rng.Uint64()}
		s, tag := d.shard(k)
		if d.lookup(s, k, tag, now) >= 0 {
			b.Fatal("fresh id found")
		}
		s.setBody(d.insert(s, k, tag, now+60_000, now), body24)
	}
}

// body24 is the size of a typical answer's body: one resource, no guard.
var body24 = make([]byte, 24)

// BenchmarkDedupFill is the same work while the ring fills for the first
// time (every op a fresh table's new slot), the state of a server's first
// DefaultDedupCapacity requests.
func BenchmarkDedupFill(b *testing.B) {
	rng := rand.New(rand.NewPCG(7, 7))
	now := int64(1)
	d := newDedup(DefaultDedupCapacity)
	b.ReportAllocs()
	n := 0
	for b.Loop() {
		if n == DefaultDedupCapacity/2 {
			b.StopTimer()
			d, n = newDedup(DefaultDedupCapacity), 0
			b.StartTimer()
		}
		n++
		k := dedupKey{keyID: 1, id: rng.Uint64()}
		s, tag := d.shard(k)
		if d.lookup(s, k, tag, now) >= 0 {
			b.Fatal("fresh id found")
		}
		s.setBody(d.insert(s, k, tag, now+60_000, now), body24)
	}
}

// BenchmarkDedupSweep is one sweep of a full ring at the default capacity
// while every id is live (a busy server: ids live for their horizon plus
// the 30 s clock skew allowance), the state sweeps meet each second.
func BenchmarkDedupSweep(b *testing.B) {
	d := newDedup(DefaultDedupCapacity)
	rng := rand.New(rand.NewPCG(7, 7))
	for range DefaultDedupCapacity {
		k := dedupKey{keyID: 1, id: rng.Uint64()}
		s, tag := d.shard(k)
		s.setBody(d.insert(s, k, tag, 60_000, 1), body24)
	}
	held := d.count.Load() // some shards got more than their share: less than the capacity
	b.ReportAllocs()
	for b.Loop() {
		d.sweep(2)
	}
	if got := d.count.Load(); got != held {
		b.Fatalf("%d ids after sweeps of %d live ids", got, held)
	}
}
