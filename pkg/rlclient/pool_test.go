package rlclient

import "testing"

// After a burst the request pool shrinks back to poolKeep, dropping only
// entries that no request needed for a whole interval (idle
// pools shrink); the timer stops with the client.
func TestReqPoolShrinksAfterBurst(t *testing.T) {
	var p reqPool
	defer p.stop()
	const burst = 500
	rs := make([]*request, burst)
	for i := range rs {
		rs[i] = p.get(nil)
	}
	for _, r := range rs {
		p.put(r)
	}
	if n := p.freeCount(); n != burst {
		t.Fatalf("free %d after the burst, want %d", n, burst)
	}
	// Interval 1 saw at least 65 entries free throughout (the timer was
	// armed when the list passed poolKeep): those go.
	p.trim()
	if n := p.freeCount(); n != burst-(poolKeep+1) {
		t.Fatalf("free %d after one quiet interval, want %d", n, burst-(poolKeep+1))
	}
	p.trim()
	if n := p.freeCount(); n != poolKeep {
		t.Fatalf("free %d after two quiet intervals, want %d", n, poolKeep)
	}
	p.trim()
	if n := p.freeCount(); n != poolKeep {
		t.Fatalf("free %d: trimmed below poolKeep", n)
	}

	// Entries in use during an interval are not trimmed: a busy pool
	// keeps what its load needs.
	for i := 0; i < burst; i++ {
		rs[i] = p.get(nil)
	}
	for _, r := range rs {
		p.put(r)
	}
	for i := 0; i < burst; i++ { // the whole list is used again
		rs[i] = p.get(nil)
	}
	for _, r := range rs {
		p.put(r)
	}
	p.trim()
	if n := p.freeCount(); n != burst {
		t.Fatalf("free %d after a busy interval, want %d (nothing idle)", n, burst)
	}
	p.stop()
	p.mu.Lock()
	armed := p.timer != nil
	p.mu.Unlock()
	if armed {
		t.Fatal("timer armed after stop")
	}
}
