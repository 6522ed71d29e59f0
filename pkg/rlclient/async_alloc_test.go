//go:build !race

package rlclient

import (
	"testing"

	"github.com/rl-tproxy/rl-tproxy/internal/dnstest"
)

// chanCompleter signals a preallocated channel: the caller's own state,
// as a loop's per-request state would be.
type chanCompleter chan error

func (c chanCompleter) CheckDone(_ *Decision, err error) { c <- err }

func TestCheckAsyncZeroAllocsSteadyState(t *testing.T) {
	d := dnstest.Start(t)
	d.SetSRV(testSRV, targetsFor(startQuietNode(t), startQuietNode(t), startQuietNode(t))...)
	c := newTestClient(t, d.Addr(), clientOpts{shards: 1})
	waitReady(t, c)
	req := testRequest()
	var dec Decision
	done := make(chanCompleter, 1)
	var comp Completer = done // converted once: a chan in an interface does not allocate per call
	check := func() {
		if _, decided, err := c.CheckAsync(req, &dec, comp); decided {
			t.Fatalf("decided at once: %v", err)
		}
		if err := <-done; err != nil {
			t.Fatalf("check: %v", err)
		}
	}
	for i := 0; i < 500; i++ {
		check()
	}
	if a := testing.AllocsPerRun(1000, check); a != 0 {
		t.Errorf("allocs per CheckAsync = %v, want 0", a)
	}
}
