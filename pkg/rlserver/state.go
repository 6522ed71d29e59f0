package rlserver

import (
	"hash/maphash"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// nShards is the number of independently locked shards of every table.
const nShards = 64

// Tracker window: p90 (nearest rank) over the samples of the last
// trackerWindow, at most the last trackerSamples.
const (
	trackerSamples = 64
	trackerWindow  = 60 * time.Second
	trackerPct     = 90
)

// bucket is one token bucket. Times are unix ns of the server clock.
type bucket struct {
	tokens   float64
	last     int64 // last refill
	used     int64 // last use, for eviction
	rate     uint32
	periodMs uint32
	capacity uint32
}

func capacityOf(rate, burst uint32) uint32 {
	if burst == 0 {
		return rate
	}
	return burst
}

// refill brings b to time now under the given parameters.
func (b *bucket) refill(now int64, rate, periodMs, burst uint32) {
	b.rate, b.periodMs, b.capacity = rate, periodMs, capacityOf(rate, burst)
	if d := now - b.last; d > 0 {
		b.tokens += float64(d) * float64(rate) / (float64(periodMs) * 1e6)
		b.last = now
	}
	if c := float64(b.capacity); b.tokens > c {
		b.tokens = c
	}
	b.used = now
}

// full reports whether b would be at capacity at now: such a bucket is
// indistinguishable from a new one and can be dropped.
func (b *bucket) full(now int64) bool {
	if b.periodMs == 0 {
		return true
	}
	t := b.tokens
	if d := now - b.last; d > 0 {
		t += float64(d) * float64(b.rate) / (float64(b.periodMs) * 1e6)
	}
	return t >= float64(b.capacity)
}

// tracker is a latency tracker: a ring of the last trackerSamples samples.
type tracker struct {
	ms   [trackerSamples]uint32
	at   [trackerSamples]int64
	n    int // valid samples in the ring
	head int // next write position
	used int64
}

func (t *tracker) add(now int64, ms uint32) {
	t.ms[t.head] = ms
	t.at[t.head] = now
	t.head = (t.head + 1) % trackerSamples
	if t.n < trackerSamples {
		t.n++
	}
	t.used = now
}

// estimate returns the p90 (nearest rank) of the samples in the window.
func (t *tracker) estimate(now int64) (uint32, bool) {
	var buf [trackerSamples]uint32
	s := buf[:0]
	from := now - int64(trackerWindow)
	for i := 0; i < t.n; i++ {
		if t.at[i] >= from {
			s = append(s, t.ms[i])
		}
	}
	if len(s) == 0 {
		return 0, false
	}
	slices.Sort(s)
	rank := (len(s)*trackerPct + 99) / 100 // ceil(0.9·n), 1-based
	return s[rank-1], true
}

func (t *tracker) empty(now int64) bool {
	from := now - int64(trackerWindow)
	for i := 0; i < t.n; i++ {
		if t.at[i] >= from {
			return false
		}
	}
	return true
}

type shard[V any] struct {
	mu sync.Mutex
	m  map[string]*V
	_  [40]byte // keep hot shards on separate cache lines
}

// table is a sharded map with a bounded number of keys; when a shard is
// full the least recently used of a random sample is evicted.
type table[V any] struct {
	shards    [nShards]shard[V]
	perShard  int
	seed      maphash.Seed
	count     atomic.Int64
	evictions atomic.Uint64
	usedAt    func(*V) int64
	idle      func(*V, int64) bool
}

func newTable[V any](maxKeys int, usedAt func(*V) int64, idle func(*V, int64) bool) *table[V] {
	t := &table[V]{perShard: max(1, maxKeys/nShards), seed: maphash.MakeSeed(), usedAt: usedAt, idle: idle}
	for i := range t.shards {
		t.shards[i].m = make(map[string]*V)
	}
	return t
}

func (t *table[V]) shardIndex(key []byte) int {
	return int(maphash.Bytes(t.seed, key) & (nShards - 1))
}

// getOrCreate returns the entry for key in shard s (locked by the caller),
// creating a zero one when missing (created = true).
func (t *table[V]) getOrCreate(s *shard[V], key []byte) (v *V, created bool) {
	if v, ok := s.m[string(key)]; ok {
		return v, false
	}
	if len(s.m) >= t.perShard {
		t.evictOne(s)
	}
	v = new(V)
	s.m[string(key)] = v
	t.count.Add(1)
	return v, true
}

func (t *table[V]) evictOne(s *shard[V]) {
	var victim string
	oldest := int64(math.MaxInt64)
	n := 0
	for k, v := range s.m {
		if u := t.usedAt(v); u < oldest {
			oldest, victim = u, k
		}
		if n++; n == 8 {
			break
		}
	}
	if n > 0 {
		delete(s.m, victim)
		t.count.Add(-1)
		t.evictions.Add(1)
	}
}

// sweep drops idle entries.
func (t *table[V]) sweep(now int64) {
	for i := range t.shards {
		s := &t.shards[i]
		s.mu.Lock()
		for k, v := range s.m {
			if t.idle(v, now) {
				delete(s.m, k)
				t.count.Add(-1)
			}
		}
		s.mu.Unlock()
	}
}
