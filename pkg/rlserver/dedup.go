package rlserver

import (
	"hash/maphash"
	"math/bits"
	"sync"
	"sync/atomic"
)

// dedupKey names a decided request (or a report): ids are unique per key.
type dedupKey struct {
	keyID uint32
	id    uint64
}

type dedupSlot struct {
	key   dedupKey
	until int64  // unix ms; the entry is valid through this time
	tag   uint32 // the key's hash tag (dedupTable.shard)
	used  bool
	body  []byte // plaintext RATE_RESPONSE body; nil for reports
}

// dedupShard holds at most len(ring) ids: a new id takes the ring's next
// slot and evicts whatever that slot held (the oldest insert). index finds
// an id's slot: open addressing with linear probing, at most half full,
// each cell 0 (empty) or the id's hash tag in the high 32 bits and its
// slot + 1 in the low 32. A lookup that misses (every new request) reads
// one or two cells and no slot; a Go map here cost a rehash now and then
// and several cache misses per request (BenchmarkDedupInsert).
type dedupShard struct {
	mu    sync.Mutex
	index []uint64
	ring  []dedupSlot
	next  int
	_     [40]byte
}

type dedupTable struct {
	shards      [nShards]dedupShard
	seed        maphash.Seed // keyed: ids are the sender's choice
	count       atomic.Int64
	evictedLive atomic.Uint64
}

func newDedup(capacity int) *dedupTable {
	d := &dedupTable{seed: maphash.MakeSeed()}
	per := max(1, capacity/nShards)
	cells := 1 << bits.Len(uint(2*per-1)) // a power of two ≥ 2·per
	for i := range d.shards {
		d.shards[i].index = make([]uint64, cells)
		d.shards[i].ring = make([]dedupSlot, per)
	}
	return d
}

// shard returns k's shard and tag from k's keyed hash: its top bits pick
// the shard, its low 32 bits are the tag (and the home cell) within it.
func (d *dedupTable) shard(k dedupKey) (*dedupShard, uint32) {
	h := maphash.Comparable(d.seed, k)
	return &d.shards[h>>(64-6)], uint32(h)
}

// find returns the cell of k's index entry, or -1 (shard locked).
func (d *dedupTable) find(s *dedupShard, k dedupKey, tag uint32) int {
	mask := len(s.index) - 1
	for i := int(tag) & mask; ; i = (i + 1) & mask {
		e := s.index[i]
		if e == 0 {
			return -1
		}
		if uint32(e>>32) == tag && s.ring[uint32(e)-1].key == k {
			return i
		}
	}
}

// lookup returns the live slot of k (shard locked by the caller) or nil.
func (d *dedupTable) lookup(s *dedupShard, k dedupKey, tag uint32, nowMs int64) *dedupSlot {
	c := d.find(s, k, tag)
	if c < 0 {
		return nil
	}
	sl := &s.ring[uint32(s.index[c])-1]
	if sl.until < nowMs {
		return nil
	}
	return sl
}

// insert records k valid through until and returns its slot, whose body the
// caller fills (shard locked by the caller).
func (d *dedupTable) insert(s *dedupShard, k dedupKey, tag uint32, until, nowMs int64) *dedupSlot {
	if c := d.find(s, k, tag); c >= 0 { // an expired entry of the same id
		sl := &s.ring[uint32(s.index[c])-1]
		sl.until = until
		sl.body = sl.body[:0]
		return sl
	}
	i := s.next
	s.next = (s.next + 1) % len(s.ring)
	sl := &s.ring[i]
	if sl.used {
		d.unindex(s, i)
		if sl.until >= nowMs {
			d.evictedLive.Add(1)
		}
	} else {
		d.count.Add(1)
	}
	sl.key, sl.tag, sl.until, sl.used = k, tag, until, true
	if sl.body == nil {
		// one allocation per slot on its first use (typical answers fit);
		// after the ring wrapped once, inserts do not allocate
		sl.body = make([]byte, 0, 64)
	}
	sl.body = sl.body[:0]
	mask := len(s.index) - 1
	c := int(tag) & mask
	for s.index[c] != 0 {
		c = (c + 1) & mask
	}
	s.index[c] = uint64(tag)<<32 | uint64(i+1)
	return sl
}

// unindex removes the index entry of ring slot i (used), closing the gap
// by moving back the entries after it that may not stay behind a hole.
func (d *dedupTable) unindex(s *dedupShard, i int) {
	mask := len(s.index) - 1
	hole := int(s.ring[i].tag) & mask
	for uint32(s.index[hole]) != uint32(i+1) {
		hole = (hole + 1) & mask
	}
	for j := (hole + 1) & mask; s.index[j] != 0; j = (j + 1) & mask {
		home := int(uint32(s.index[j]>>32)) & mask
		// The entry at j may move to the hole unless its home lies
		// cyclically in (hole, j]: then its probe starts after the hole.
		if (j-home)&mask >= (j-hole)&mask {
			s.index[hole] = s.index[j]
			hole = j
		}
	}
	s.index[hole] = 0
}

// sweep forgets expired entries.
func (d *dedupTable) sweep(nowMs int64) {
	for i := range d.shards {
		s := &d.shards[i]
		s.mu.Lock()
		for j := range s.ring {
			sl := &s.ring[j]
			if sl.used && sl.until < nowMs {
				d.unindex(s, j)
				sl.used = false
				d.count.Add(-1)
			}
		}
		s.mu.Unlock()
	}
}
