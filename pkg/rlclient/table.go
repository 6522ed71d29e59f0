package rlclient

import (
	"sync"
)

// stripeShift and stripeMask pick a request id's stripe: ids keep their
// low tokenBits zero (tokenMask), the next 6 bits choose one of 64 stripes.
const (
	stripeShift = 6
	stripeMask  = 63
)

// reqTable maps live request ids to their state, striped to spread lock
// contention. Ids have their low 6 bits zero (tokenMask); bits 6..11 pick
// the stripe.
type reqTable struct {
	stripes [stripeMask + 1]tableStripe
}

type tableStripe struct {
	mu sync.Mutex
	m  map[uint64]*request
	_  [40]byte
}

func (t *reqTable) init() {
	for i := range t.stripes {
		t.stripes[i].m = make(map[uint64]*request, 64)
	}
}

func (t *reqTable) stripe(id uint64) *tableStripe { return &t.stripes[(id>>stripeShift)&stripeMask] }

func (t *reqTable) put(r *request) {
	s := t.stripe(r.id)
	s.mu.Lock()
	s.m[r.id] = r
	s.mu.Unlock()
}

func (t *reqTable) get(id uint64) *request {
	s := t.stripe(id)
	s.mu.Lock()
	r := s.m[id]
	s.mu.Unlock()
	return r
}

func (t *reqTable) remove(id uint64) {
	s := t.stripe(id)
	s.mu.Lock()
	delete(s.m, id)
	s.mu.Unlock()
}

// failAll ends every live request with CauseCancelled (Close).
func (t *reqTable) failAll(*Client) {
	var live []*request
	for i := range t.stripes {
		s := &t.stripes[i]
		s.mu.Lock()
		for _, r := range s.m {
			live = append(live, r)
		}
		s.mu.Unlock()
	}
	for _, r := range live {
		r.mu.Lock()
		r.finishLocked(CauseCancelled)
		r.unlock()
	}
}
