package rlclient

import (
	"sync"
	"time"
)

// manualClock is a Clock that moves only when the test calls Advance.
type manualClock struct {
	mu     sync.Mutex
	now    time.Time
	timers []*manualTimer
}

func newManualClock(start time.Time) *manualClock { return &manualClock{now: start} }

func (c *manualClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *manualClock) NewTimer(d time.Duration) Timer {
	t := &manualTimer{clk: c, ch: make(chan time.Time, 1)}
	t.ResetAt(c.Now().Add(d))
	c.mu.Lock()
	c.timers = append(c.timers, t)
	c.mu.Unlock()
	return t
}

// Advance moves the clock and fires every timer that became due.
func (c *manualClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	now := c.now
	ts := append([]*manualTimer(nil), c.timers...)
	c.mu.Unlock()
	for _, t := range ts {
		t.fireIfDue(now)
	}
}

type manualTimer struct {
	clk    *manualClock
	mu     sync.Mutex
	ch     chan time.Time
	when   time.Time
	active bool
}

func (t *manualTimer) C() <-chan time.Time { return t.ch }

func (t *manualTimer) ResetAt(at time.Time) {
	t.mu.Lock()
	select { // no stale value after a reset
	case <-t.ch:
	default:
	}
	t.when = at
	t.active = true
	t.mu.Unlock()
	t.fireIfDue(t.clk.Now())
}

func (t *manualTimer) Stop() {
	t.mu.Lock()
	t.active = false
	select {
	case <-t.ch:
	default:
	}
	t.mu.Unlock()
}

func (t *manualTimer) fireIfDue(now time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.active && !t.when.After(now) {
		t.active = false
		select {
		case t.ch <- now:
		default:
		}
	}
}
