//go:build !race

package rlclient

import (
	"net"
	"testing"
	"time"

	"github.com/rl-tproxy/rl-tproxy/internal/dnstest"
	"github.com/rl-tproxy/rl-tproxy/pkg/ratelimitly"
)

// chanLoopCompleter signals a preallocated channel from the loop.
type chanLoopCompleter chan error

func (c chanLoopCompleter) CheckDone(_ *Decision, err error) { c <- errHandedOff }

func (c chanLoopCompleter) CheckDoneOnLoop(_ *Decision, err error) { c <- err }

var errHandedOff = errorString("completed off the loop")

type errorString string

func (e errorString) Error() string { return string(e) }

// loopChecker returns a function that runs one check on c's loop 0 and
// waits for its end, failing unless the end is want.
func loopChecker(t *testing.T, c *Client, want error) func() {
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
	return func() {
		l.Post(start)
		if err := <-done; err != want {
			t.Fatalf("check: %v, want %v", err, want)
		}
	}
}

// TestLoopCheckZeroAllocsSteadyState: a check started on a loop, sent at
// its turn end, answered and completed on the loop allocates nothing.
func TestLoopCheckZeroAllocsSteadyState(t *testing.T) {
	d := dnstest.Start(t)
	d.SetSRV(testSRV, targetsFor(startQuietNode(t), startQuietNode(t))...)
	c := newTestClient(t, d.Addr(), clientOpts{shards: 1, loops: 1})
	waitReady(t, c)
	check := loopChecker(t, c, nil)
	for range 500 {
		check()
	}
	if a := testing.AllocsPerRun(1000, check); a != 0 {
		t.Errorf("allocs per loop check round trip = %v, want 0", a)
	}
}

// TestLoopDeadlineZeroAllocsSteadyState: a loop check that no server
// answers (replay, final receive, timeout, all on the loop's own timer)
// allocates nothing either.
func TestLoopDeadlineZeroAllocsSteadyState(t *testing.T) {
	silent, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)}) // never read
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	d := dnstest.Start(t)
	d.SetSRV(testSRV, targetsFor(silent.LocalAddr().(*net.UDPAddr).AddrPort())...)
	c := newTestClient(t, d.Addr(), clientOpts{shards: 1, loops: 1, policy: ratelimitly.Standard(time.Millisecond)})
	waitReady(t, c)
	check := loopChecker(t, c, ErrTimeout)
	for range 100 {
		check()
	}
	if a := testing.AllocsPerRun(200, check); a != 0 {
		t.Errorf("allocs per loop check timed out on the loop = %v, want 0", a)
	}
	if st := c.Stats(); st.LoopHandoffs != 0 {
		t.Errorf("%d hand-offs", st.LoopHandoffs)
	}
}
