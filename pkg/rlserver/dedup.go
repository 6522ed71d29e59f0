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

// inlineBody is how many bytes of a slot's plaintext RATE_RESPONSE body
// live in the slot itself: one resource with up to 16 guards, or up to 7
// resources, fit. A longer body (at most 556 bytes: 32 guards and 32
// resources) goes to the shard's large map. With the body inline the ring
// holds no pointers: filling it allocates nothing, the garbage collector
// does not scan it, and an answer's slot and body share two cache lines.
const inlineBody = 96

type dedupSlot struct {
	key   dedupKey
	until int64  // unix ms; the entry is valid through this time
	tag   uint32 // the key's hash tag (dedupTable.shard)
	n     uint16 // body length; 0 for reports
	large bool   // the body is in the shard's large map
	small [inlineBody]byte
}

// dedupShard holds at most len(ring) ids, in the order they came: the n
// slots before next (cyclically) hold ids, the oldest first. A new id
// takes slot next and, when the ring is full, evicts the oldest id from
// it; sweep forgets expired ids from the oldest end. index finds
// an id's slot: open addressing with linear probing, at most half full,
// each cell 0 (empty) or the id's hash tag in the high 32 bits and its
// slot + 1 in the low 32. A lookup that misses (every new request) reads
// one or two cells and no slot; a Go map here cost a rehash now and then
// and several cache misses per request (BenchmarkDedupInsert).
type dedupShard struct {
	mu    sync.Mutex
	index []uint64
	ring  []dedupSlot
	large map[int][]byte // bodies longer than inlineBody, by ring slot
	next  int            // the slot the next new id takes
	n     int            // ids held: the n slots before next
	_     [24]byte
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

// capacity is the number of ids the table holds at most.
func (d *dedupTable) capacity() int { return len(d.shards) * len(d.shards[0].ring) }

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

// lookup returns the ring slot of k while it is live (shard locked by the
// caller), or -1.
func (d *dedupTable) lookup(s *dedupShard, k dedupKey, tag uint32, nowMs int64) int {
	c := d.find(s, k, tag)
	if c < 0 {
		return -1
	}
	i := int(uint32(s.index[c])) - 1
	if s.ring[i].until < nowMs {
		return -1
	}
	return i
}

// insert records k valid through until with an empty body and returns its
// ring slot, whose body the caller may set (shard locked by the caller).
func (d *dedupTable) insert(s *dedupShard, k dedupKey, tag uint32, until, nowMs int64) int {
	if c := d.find(s, k, tag); c >= 0 { // an expired entry of the same id
		i := int(uint32(s.index[c])) - 1
		s.ring[i].until = until
		s.setBody(i, nil)
		return i
	}
	i := s.next
	s.next = (s.next + 1) % len(s.ring)
	sl := &s.ring[i]
	if s.n == len(s.ring) { // full: slot i holds the oldest id
		d.unindex(s, i)
		if sl.until >= nowMs {
			d.evictedLive.Add(1)
		}
	} else {
		s.n++
		d.count.Add(1)
	}
	sl.key, sl.tag, sl.until = k, tag, until
	s.setBody(i, nil)
	mask := len(s.index) - 1
	c := int(tag) & mask
	for s.index[c] != 0 {
		c = (c + 1) & mask
	}
	s.index[c] = uint64(tag)<<32 | uint64(i+1)
	return i
}

// body returns slot i's body (shard locked; valid until the slot changes).
func (s *dedupShard) body(i int) []byte {
	sl := &s.ring[i]
	if sl.large {
		return s.large[i]
	}
	return sl.small[:sl.n]
}

// setBody stores a copy of b as slot i's body (shard locked).
func (s *dedupShard) setBody(i int, b []byte) {
	sl := &s.ring[i]
	if len(b) <= inlineBody {
		if sl.large {
			delete(s.large, i)
			sl.large = false
		}
		sl.n = uint16(copy(sl.small[:], b))
		return
	}
	if s.large == nil {
		s.large = make(map[int][]byte)
	}
	s.large[i] = append(s.large[i][:0], b...)
	sl.large, sl.n = true, uint16(len(b))
}

// unindex removes the index entry of ring slot i (held), closing the gap
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

// sweep forgets expired ids from each shard's oldest end and stops at the
// first live one, so its work is the ids it forgets, not the ring: at the
// default capacity a walk of the whole ring read 16 MiB each second while
// every id was live. Ids come in roughly the order they expire; one that
// expires before an older one (a shorter ttl_ms, a sender's clock behind
// the others, an older id kept longer by a replay) waits for that one or
// for the ring to reuse its slot. Lookups never find expired ids, swept or
// not.
func (d *dedupTable) sweep(nowMs int64) {
	for i := range d.shards {
		s := &d.shards[i]
		s.mu.Lock()
		for s.n > 0 {
			t := s.next - s.n
			if t < 0 {
				t += len(s.ring)
			}
			if s.ring[t].until >= nowMs {
				break
			}
			d.unindex(s, t)
			s.setBody(t, nil)
			s.n--
			d.count.Add(-1)
		}
		s.mu.Unlock()
	}
}
