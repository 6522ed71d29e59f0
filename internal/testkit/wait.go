package testkit

import (
	"testing"
	"time"
)

// WaitBound is WaitFor's bound: generous, because the CI machine has two
// cores shared with other jobs. It only matters when the condition never
// holds, and then the test fails.
const WaitBound = 30 * time.Second

// maxPollGap is the longest pause between two evaluations of a condition.
const maxPollGap = 10 * time.Millisecond

// WaitFor polls cond until it holds and fails t (naming what it waited
// for) after WaitBound. cond reads observable state; this is how a test
// waits for something other goroutines or processes do, never a sleep.
func WaitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	WaitWithin(t, WaitBound, what, cond)
}

// WaitWithin is WaitFor with an explicit bound.
func WaitWithin(t testing.TB, bound time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(bound)
	gap := time.Millisecond
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", bound, what)
			return
		}
		time.Sleep(gap)
		gap = min(2*gap, maxPollGap)
	}
}
