package rlclient

import (
	"math/bits"
	"sync"
)

const (
	// stripeShift: ids keep their low 6 bits zero (tokenMask); the bits
	// above pick the stripe, and the bits above those the home slot.
	stripeShift = 6
	// minStripes and maxStripes bound the stripe count (stripesFor).
	minStripes, maxStripes = 4, 64
	// stripeSlots is a stripe's first size (grown by doubling).
	stripeSlots = 64
)

// stripesFor is the stripe count for procs threads that may check at
// once: four per thread, a power of two within [minStripes, maxStripes].
// Enough that two threads rarely want one stripe's lock at once, and no
// more: every check touches a random stripe's lock and slots, and with 64
// stripes on one thread those lines had gone cold between its uses (the
// slots load was 80 % of put's samples; 0.13-0.28 -> 0.05-0.07 us per
// check with 4 stripes, wrk -c64 through the admission location).
func stripesFor(procs int) int {
	n := 1 << bits.Len(uint(max(4*procs, 1)-1))
	return min(max(n, minStripes), maxStripes)
}

// reqTable maps live request ids to their state, striped to spread lock
// contention: bits 6 and up of an id (as many as the stripe count needs)
// pick its stripe.
type reqTable struct {
	stripes []tableStripe
	mask    uint64 // len(stripes) - 1
}

// tableStripe is open addressing with linear probing, at most half full:
// a lookup for an answer's id reads one or two slots (ids are random, so
// their bits are the hash). A Go map here cost hashing and several cache
// misses per check (rlclient's share of the admission profile). Growth
// doubles the slots (an allocation only when more checks are in flight
// than ever before on the stripe); removal moves entries back over the
// hole, so no tombstones pile up.
type tableStripe struct {
	mu    sync.Mutex
	slots []*request // nil: empty
	n     int
	shift uint32 // drops the token and stripe bits: the rest picks the home slot
	_     [20]byte
}

// init makes n stripes (a power of two).
func (t *reqTable) init(n int) {
	t.stripes = make([]tableStripe, n)
	t.mask = uint64(n - 1)
	shift := uint32(stripeShift + bits.TrailingZeros(uint(n)))
	for i := range t.stripes {
		t.stripes[i].slots = make([]*request, stripeSlots)
		t.stripes[i].shift = shift
	}
}

func (t *reqTable) stripe(id uint64) *tableStripe { return &t.stripes[(id>>stripeShift)&t.mask] }

func (s *tableStripe) home(id uint64) int { return int(id>>s.shift) & (len(s.slots) - 1) }

// insert places r (its id not in s; the slots have room).
func (s *tableStripe) insert(r *request) {
	mask := len(s.slots) - 1
	i := s.home(r.id)
	for s.slots[i] != nil {
		i = (i + 1) & mask
	}
	s.slots[i] = r
	s.n++
}

// find returns the slot holding id, or -1.
func (s *tableStripe) find(id uint64) int {
	mask := len(s.slots) - 1
	for i := s.home(id); s.slots[i] != nil; i = (i + 1) & mask {
		if s.slots[i].id == id {
			return i
		}
	}
	return -1
}

func (t *reqTable) put(r *request) {
	s := t.stripe(r.id)
	s.mu.Lock()
	if i := s.find(r.id); i >= 0 { // the same id again (a 58-bit collision): replace
		s.slots[i] = r
		s.mu.Unlock()
		return
	}
	if 2*(s.n+1) > len(s.slots) {
		old := s.slots
		s.slots, s.n = make([]*request, 2*len(old)), 0
		for _, o := range old {
			if o != nil {
				s.insert(o)
			}
		}
	}
	s.insert(r)
	s.mu.Unlock()
}

func (t *reqTable) get(id uint64) *request {
	s := t.stripe(id)
	s.mu.Lock()
	var r *request
	if i := s.find(id); i >= 0 {
		r = s.slots[i]
	}
	s.mu.Unlock()
	return r
}

func (t *reqTable) remove(id uint64) {
	s := t.stripe(id)
	s.mu.Lock()
	if hole := s.find(id); hole >= 0 {
		mask := len(s.slots) - 1
		for j := (hole + 1) & mask; s.slots[j] != nil; j = (j + 1) & mask {
			// The entry at j may move back to the hole unless its home
			// lies cyclically in (hole, j]: its probe starts after the hole.
			if (j-s.home(s.slots[j].id))&mask >= (j-hole)&mask {
				s.slots[hole] = s.slots[j]
				hole = j
			}
		}
		s.slots[hole] = nil
		s.n--
	}
	s.mu.Unlock()
}

// each calls fn for every live request of the stripe (s.mu held).
func (s *tableStripe) each(fn func(*request)) {
	for _, r := range s.slots {
		if r != nil {
			fn(r)
		}
	}
}

// failAll ends every live request with CauseCancelled (Close).
func (t *reqTable) failAll(*Client) {
	var live []*request
	for i := range t.stripes {
		s := &t.stripes[i]
		s.mu.Lock()
		s.each(func(r *request) { live = append(live, r) })
		s.mu.Unlock()
	}
	for _, r := range live {
		r.mu.Lock()
		r.finishLocked(CauseCancelled)
		r.unlock()
	}
}
