//go:build !race

package rlclient

import (
	"testing"

	"github.com/rl-tproxy/rl-tproxy/internal/dnstest"
)

// chanLoopCompleter signals a preallocated channel from the loop.
type chanLoopCompleter chan error

func (c chanLoopCompleter) CheckDone(_ *Decision, err error) { c <- errHandedOff }

func (c chanLoopCompleter) CheckDoneOnLoop(_ *Decision, err error) { c <- err }

var errHandedOff = errorString("completed off the loop")

type errorString string

func (e errorString) Error() string { return string(e) }

// TestLoopCheckZeroAllocsSteadyState: a check started on a loop, sent at
// its turn end, answered and completed on the loop allocates nothing.
func TestLoopCheckZeroAllocsSteadyState(t *testing.T) {
	d := dnstest.Start(t)
	d.SetSRV(testSRV, targetsFor(startQuietNode(t), startQuietNode(t))...)
	c := newTestClient(t, d.Addr(), clientOpts{shards: 1, loops: 1})
	waitReady(t, c)
	h := startLoops(t, c, 1)
	l := h.g.Loops()[0]
	req := testRequest()
	var dec Decision
	done := make(chanLoopCompleter, 1)
	var comp Completer = done
	start := func() {
		if _, decided, err := c.CheckAsyncLoop(0, req, &dec, comp); decided {
			done <- err
		}
	}
	check := func() {
		l.Post(start)
		if err := <-done; err != nil {
			t.Fatalf("check: %v", err)
		}
	}
	for range 500 {
		check()
	}
	if a := testing.AllocsPerRun(1000, check); a != 0 {
		t.Errorf("allocs per loop check round trip = %v, want 0", a)
	}
}
