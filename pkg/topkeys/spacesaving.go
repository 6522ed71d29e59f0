// Package topkeys finds, per zone, the keys (rendered buckets) with the
// most denies over a sliding window, in bounded memory: a Space-Saving
// summary of the denies and a count-min sketch of the allows per
// sub-window. The allow path is lock-free and allocation-free.
package topkeys

import "bytes"

// MaxKeyLen is how many bytes of a key a summary keeps; a longer key is
// identified by its hash and shown cut to this length, with Truncated set.
const MaxKeyLen = 96

// Counter is one key of a summary: Count is an upper bound of its true
// count and Count − Err a lower bound.
type Counter struct {
	Key       string
	Truncated bool
	Count     uint64
	Err       uint64
}

type ssSlot struct {
	hash  uint64
	klen  int // full length of the key
	count uint64
	err   uint64
	key   [MaxKeyLen]byte
}

func (s *ssSlot) is(h uint64, key []byte) bool {
	if s.hash != h || s.klen != len(key) {
		return false
	}
	n := min(len(key), MaxKeyLen)
	return bytes.Equal(s.key[:n], key[:n])
}

func (s *ssSlot) set(h uint64, key []byte, count, err uint64) {
	s.hash, s.klen, s.count, s.err = h, len(key), count, err
	copy(s.key[:], key)
}

// SpaceSaving is the Space-Saving heavy-hitter summary (Metwally et al.,
// 2005) with a fixed number of counters: after N additions, every key
// counted more than N/k times is in it, and each counter overestimates
// its key by at most Err ≤ N/k. It is not safe for concurrent use and
// allocates only in New.
type SpaceSaving struct {
	slots []ssSlot
	n     int    // slots in use
	total uint64 // additions since Reset
}

// New returns a summary with k counters (k ≥ 1).
func New(k int) *SpaceSaving {
	return &SpaceSaving{slots: make([]ssSlot, max(1, k))}
}

// Reset forgets every key.
func (s *SpaceSaving) Reset() { s.n, s.total = 0, 0 }

// Total is the number of additions since Reset.
func (s *SpaceSaving) Total() uint64 { return s.total }

// Full reports whether every counter holds a key (absent keys may then
// have a count up to Min).
func (s *SpaceSaving) Full() bool { return s.n == len(s.slots) }

// Min is the smallest count held (0 when not full): the most any absent
// key can have been added.
func (s *SpaceSaving) Min() uint64 {
	if !s.Full() {
		return 0
	}
	m := s.slots[0].count
	for i := 1; i < s.n; i++ {
		m = min(m, s.slots[i].count)
	}
	return m
}

// Add counts one occurrence of key, whose hash is h (the caller's; equal
// keys must have equal hashes). It does not allocate.
func (s *SpaceSaving) Add(h uint64, key []byte) {
	s.total++
	for i := 0; i < s.n; i++ {
		if s.slots[i].is(h, key) {
			s.slots[i].count++
			return
		}
	}
	if s.n < len(s.slots) {
		s.slots[s.n].set(h, key, 1, 0)
		s.n++
		return
	}
	m := 0
	for i := 1; i < s.n; i++ {
		if s.slots[i].count < s.slots[m].count {
			m = i
		}
	}
	c := s.slots[m].count
	s.slots[m].set(h, key, c+1, c)
}

// Each calls f for every key held, in no particular order.
func (s *SpaceSaving) Each(f func(h uint64, c Counter)) {
	for i := 0; i < s.n; i++ {
		sl := &s.slots[i]
		n := min(sl.klen, MaxKeyLen)
		f(sl.hash, Counter{Key: string(sl.key[:n]), Truncated: sl.klen > MaxKeyLen, Count: sl.count, Err: sl.err})
	}
}
