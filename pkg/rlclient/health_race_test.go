package rlclient

import (
	"sync/atomic"
	"testing"
	"time"
)

// A send that starts a miss episode and is paused half-way (as a
// preempted goroutine is) never lets other sends make the endpoint look
// unusable with the since of an episode long over: the old order (count
// first, then store since) exposed MissLimit pending requests with the
// stale since in between.
func TestHealthSentNeverExposesStaleSince(t *testing.T) {
	const (
		now     = int64(1e18)
		horizon = time.Second
	)
	var h health
	h.since.Store(1) // an episode long ago
	paused, release := make(chan struct{}), make(chan struct{})
	var first atomic.Bool
	sentPause = func() {
		if first.CompareAndSwap(false, true) {
			close(paused)
			<-release
		}
	}
	defer func() { sentPause = nil }()
	done := make(chan struct{})
	go func() {
		defer close(done)
		h.sent(now)
	}()
	select {
	case <-paused:
	case <-time.After(10 * time.Second):
		t.Fatal("the first send never started an episode")
	}
	for range MissLimit - 1 {
		h.sent(now)
	}
	usable := h.usable(now, horizon)
	pending, since := h.pending.Load(), h.since.Load()
	close(release)
	<-done
	if !usable {
		t.Fatalf("unusable right after its sends while one was paused (pending %d, since %d)", pending, since)
	}
	if got := h.pending.Load(); got != MissLimit {
		t.Fatalf("pending %d after %d sends, want %d", got, MissLimit, MissLimit)
	}
	if !h.usable(now, horizon) || h.usable(now+int64(horizon), horizon) {
		t.Fatalf("after the sends: since %d, want %d", h.since.Load(), now)
	}
}
