package topkeys

import (
	"hash/maphash"
	"math/bits"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// Window geometry and sizes. The window is SubWindows sub-windows of
// SubWindow each; a query covers the current (partial) sub-window and the
// SubWindows−1 before it, so the last 50 to 60 seconds.
const (
	SubWindow  = 10 * time.Second
	SubWindows = 6
	Window     = SubWindows * SubWindow
	// Slots is the number of Space-Saving counters per sub-window.
	Slots = 64
	// The count-min sketch of allows: cmsDepth rows of cmsWidth counters
	// per sub-window, in a ring of cmsRing sub-windows (two more than
	// the window: the next one is cleared ahead of use).
	cmsDepth = 3
	cmsWidth = 1024
	cmsRing  = SubWindows + 2
)

// StateBytes is the memory one zone holds, whatever its traffic.
const StateBytes = SubWindows*Slots*int(ssSlotSize) + cmsRing*(cmsDepth*cmsWidth*4+8)

const ssSlotSize = 8 + 8 + 8 + 8 + MaxKeyLen

type ssWindow struct {
	epoch int64 // sub-window number (unix time / SubWindow); 0 = unused
	s     SpaceSaving
}

type cmsWindow struct {
	epoch atomic.Int64
	c     [cmsDepth * cmsWidth]atomic.Uint32
}

// Zone is the windowed summary of one zone. Allow is lock-free and
// allocation-free; Deny takes the zone's mutex and allocates nothing.
type Zone struct {
	seed maphash.Seed

	mu sync.Mutex
	ss [SubWindows]ssWindow

	// newest is the newest sub-window whose allow sketch was prepared.
	newest atomic.Int64
	cms    [cmsRing]cmsWindow
}

func newZone(seed maphash.Seed) *Zone {
	z := &Zone{seed: seed}
	for i := range z.ss {
		z.ss[i].s.slots = make([]ssSlot, Slots)
	}
	return z
}

func epochOf(unixNs int64) int64 { return unixNs / int64(SubWindow) }

// Allow counts an allowed request for key at unixNs (the request's time).
func (z *Zone) Allow(key []byte, unixNs int64) {
	if z == nil {
		return
	}
	e := epochOf(unixNs)
	if n := z.newest.Load(); n != e {
		if e < n-1 {
			return // older than the sketch kept for writing: dropped
		}
		if e > n {
			z.advance(e)
		}
	}
	w := &z.cms[e%cmsRing]
	if w.epoch.Load() != e {
		return
	}
	h := maphash.Bytes(z.seed, key)
	for d := range cmsDepth {
		w.c[d*cmsWidth+cmsIndex(h, d)].Add(1)
	}
}

// cmsIndex is row d's counter for hash h (double hashing).
func cmsIndex(h uint64, d int) int {
	lo, hi := uint32(h), uint32(h>>32)|1
	return int((lo + uint32(d)*hi) % cmsWidth)
}

// advance makes e the newest sub-window: its sketch and the next one's
// are cleared (the next one ahead of time, so that writers at the turn
// of a sub-window find it ready).
func (z *Zone) advance(e int64) {
	for {
		n := z.newest.Load()
		if n >= e {
			return
		}
		if z.newest.CompareAndSwap(n, e) {
			break
		}
	}
	z.prepare(e)
	z.prepare(e + 1)
}

// prepare clears sub-window e's sketch once: the first caller claims it
// (its epoch becomes −e while it is cleared, which writers skip) and a
// caller that comes late, or for an older sub-window, leaves it alone.
func (z *Zone) prepare(e int64) {
	w := &z.cms[e%cmsRing]
	for {
		cur := w.epoch.Load()
		if cur == e || cur == -e || cur > e || -cur > e {
			return
		}
		if w.epoch.CompareAndSwap(cur, -e) {
			break
		}
	}
	for i := range w.c {
		w.c[i].Store(0)
	}
	w.epoch.Store(e)
}

// Deny counts a deny for key at unixNs.
func (z *Zone) Deny(key []byte, unixNs int64) {
	if z == nil {
		return
	}
	e := epochOf(unixNs)
	h := maphash.Bytes(z.seed, key)
	z.mu.Lock()
	w := &z.ss[e%SubWindows]
	switch {
	case w.epoch == e:
	case w.epoch < e:
		w.epoch = e
		w.s.Reset()
	default: // a sub-window that already left the window
		z.mu.Unlock()
		return
	}
	w.s.Add(h, key)
	z.mu.Unlock()
	if z.newest.Load() < e {
		z.advance(e)
	}
}

// Key is one key of a zone's top list.
type Key struct {
	Key       string `json:"key"`
	Truncated bool   `json:"truncated,omitempty"`
	// Denies is an upper bound of the key's denies in the window and
	// Denies − Error a lower bound.
	Denies uint64 `json:"denies"`
	Error  uint64 `json:"error"`
	// Allows is the count-min estimate of the key's allows in the window:
	// never below the true count, except for allows that raced with the
	// clearing of a sub-window's sketch after a quiet sub-window; above it
	// by at most e/1024 (0.27%) of the zone's allows in the window with
	// probability 95%.
	Allows uint64 `json:"allows"`
}

// Summary is a zone's top list at one time.
type Summary struct {
	// Denies is the number of denies counted in the window.
	Denies uint64 `json:"denies"`
	// ErrorBound bounds every key's Error: Denies / Slots.
	ErrorBound uint64 `json:"error_bound"`
	Keys       []Key  `json:"keys"`
}

// Top returns the n keys with the most denies in the window that ends at
// unixNs, most denied first (ties by key).
func (z *Zone) Top(n int, unixNs int64) Summary {
	e := epochOf(unixNs)
	type acc struct {
		key       Counter
		present   [SubWindows]bool
		cnt, errs uint64
	}
	var (
		live  []int // sub-windows in the window
		mins  [SubWindows]uint64
		cands = map[uint64]*acc{}
		sum   Summary
	)
	z.mu.Lock()
	for i := range z.ss {
		w := &z.ss[i]
		if w.epoch == 0 || w.epoch <= e-SubWindows || w.epoch > e {
			continue
		}
		live = append(live, i)
		mins[i] = w.s.Min()
		sum.Denies += w.s.Total()
		w.s.Each(func(h uint64, c Counter) {
			a := cands[h]
			if a == nil {
				a = &acc{key: c}
				cands[h] = a
			}
			a.present[i] = true
			a.cnt += c.Count
			a.errs += c.Err
		})
	}
	z.mu.Unlock()
	sum.ErrorBound = sum.Denies / Slots
	keys := make([]Key, 0, len(cands))
	hashes := make([]uint64, 0, len(cands))
	for h, a := range cands {
		k := Key{Key: a.key.Key, Truncated: a.key.Truncated, Denies: a.cnt, Error: a.errs}
		for _, i := range live {
			if !a.present[i] { // absent from a full summary: up to its minimum
				k.Denies += mins[i]
				k.Error += mins[i]
			}
		}
		keys = append(keys, k)
		hashes = append(hashes, h)
	}
	idx := make([]int, len(keys))
	for i := range idx {
		idx[i] = i
	}
	slices.SortFunc(idx, func(a, b int) int {
		if keys[a].Denies != keys[b].Denies {
			if keys[a].Denies > keys[b].Denies {
				return -1
			}
			return 1
		}
		switch {
		case keys[a].Key < keys[b].Key:
			return -1
		case keys[a].Key > keys[b].Key:
			return 1
		}
		return 0
	})
	if n > len(idx) {
		n = len(idx)
	}
	sum.Keys = make([]Key, 0, n)
	for _, i := range idx[:n] {
		k := keys[i]
		k.Allows = z.allows(hashes[i], e)
		sum.Keys = append(sum.Keys, k)
	}
	return sum
}

// allows is the count-min estimate of h's allows in the window ending in
// sub-window e: per sub-window the smallest of its rows, summed.
func (z *Zone) allows(h uint64, e int64) uint64 {
	var total uint64
	for i := range z.cms {
		w := &z.cms[i]
		we := w.epoch.Load()
		if we <= 0 || we <= e-SubWindows || we > e {
			continue
		}
		m := uint64(1<<32 - 1)
		for d := range cmsDepth {
			m = min(m, uint64(w.c[d*cmsWidth+cmsIndex(h, d)].Load()))
		}
		total, _ = bits.Add64(total, m, 0)
	}
	return total
}
