package rlclient

import (
	"testing"
	"time"
)

// popAll pops every live deadline in order and returns their requests.
func popAll(es *shardEngine) []*request {
	var out []*request
	es.mu.Lock()
	defer es.mu.Unlock()
	for {
		at, ok := es.nextLocked()
		if !ok {
			return out
		}
		e := es.popLocked()
		if !e.at.Equal(at) {
			panic("popLocked disagrees with nextLocked")
		}
		out = append(out, e.r)
	}
}

func TestDeadlineOrder(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	type op struct {
		req    int // request index
		ms     int // schedule at t0+ms; -1 = unschedule
		inHeap bool
	}
	tests := []struct {
		name string
		ops  []op
		want []int // request indexes in firing order
	}{
		{"in order: FIFO", []op{{0, 10, false}, {1, 20, false}, {2, 20, false}, {3, 30, false}}, []int{0, 1, 2, 3}},
		{"earlier than the last: heap", []op{{0, 10, false}, {1, 30, false}, {2, 20, true}, {3, 5, true}}, []int{3, 0, 2, 1}},
		{"retired before the deadline", []op{{0, 10, false}, {1, 20, false}, {0, -1, false}, {2, 30, false}}, []int{1, 2}},
		{"retired from the heap", []op{{0, 30, false}, {1, 10, true}, {1, -1, false}}, []int{0}},
		{"rescheduled (a replay): only the latest fires", []op{{0, 10, false}, {1, 20, false}, {0, 40, false}, {1, 15, true}}, []int{1, 0}},
		{"rescheduled earlier", []op{{0, 10, false}, {1, 50, false}, {1, 20, true}}, []int{0, 1}},
		{"everything retired", []op{{0, 10, false}, {1, 20, false}, {0, -1, false}, {1, -1, false}}, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			es := &shardEngine{wake: make(chan struct{}, 1)}
			reqs := make([]*request, 4)
			for i := range reqs {
				reqs[i] = &request{hidx: -1}
			}
			for _, o := range tc.ops {
				r := reqs[o.req]
				if o.ms < 0 {
					es.unschedule(r)
					continue
				}
				es.schedule(r, at(o.ms))
				if got := r.hidx >= 0; got != o.inHeap {
					t.Fatalf("request %d at %d ms: in heap %v, want %v", o.req, o.ms, got, o.inHeap)
				}
			}
			es.mu.Lock()
			pending := es.pendingLocked()
			es.mu.Unlock()
			if pending != len(tc.want) {
				t.Errorf("pending %d, want %d", pending, len(tc.want))
			}
			got := popAll(es)
			if len(got) != len(tc.want) {
				t.Fatalf("fired %d deadlines, want %d", len(got), len(tc.want))
			}
			for i, r := range got {
				if r != reqs[tc.want[i]] {
					t.Fatalf("deadline %d fired for the wrong request (want request %d)", i, tc.want[i])
				}
			}
			es.mu.Lock()
			defer es.mu.Unlock()
			if n := es.pendingLocked(); n != 0 {
				t.Errorf("%d deadlines left after popping all", n)
			}
		})
	}
}

// TestDeadlineFIFOReusesArray: checks that are retired before their
// deadline (the common case) never grow the FIFO past what is in flight,
// even when one old check stays pending for a long time.
func TestDeadlineFIFOReusesArray(t *testing.T) {
	es := &shardEngine{wake: make(chan struct{}, 1), fifo: make([]timerEntry, 0, 64)}
	t0 := time.Unix(1000, 0)
	inflight := make([]*request, 16)
	for i := range inflight {
		inflight[i] = &request{hidx: -1}
	}
	for i := range 100_000 {
		r := inflight[i%len(inflight)]
		es.unschedule(r) // decided: retire its deadline
		es.schedule(r, t0.Add(time.Duration(i)*time.Microsecond))
	}
	es.mu.Lock()
	defer es.mu.Unlock()
	if live := es.pendingLocked(); live != len(inflight) {
		t.Fatalf("%d live deadlines, want %d", live, len(inflight))
	}
	if c := cap(es.fifo); c > 64 {
		t.Errorf("FIFO grew to %d entries for %d checks in flight", c, len(inflight))
	}
}
