//go:build !race

// Allocation tests (testing.AllocsPerRun). Their counts are meaningless
// under -race (the detector allocates, sync.Pool drops items), so this file
// is left out of the race run and `make test-alloc` runs it without -race.
// Every test here has "Alloc" in its name: that pass selects them by it.

package udpshard

import (
	"net/netip"
	"runtime"
	"testing"
	"time"
)

func TestSteadyStateAllocs(t *testing.T) {
	srv, _ := echoServer(t)
	got := make(chan uint64, 1)
	r := newTestRing(t, 1, func(_ *Socket, pkt []byte, _ netip.AddrPort) { got <- uint64(len(pkt)) })
	pkt := make([]byte, 200)
	roundTrip := func() {
		if err := r.SendCurrent(0, srv, pkt, 0); err != nil {
			t.Fatal(err)
		}
		<-got
	}
	for i := 0; i < 100; i++ {
		roundTrip()
	}
	if a := testing.AllocsPerRun(500, roundTrip); a != 0 {
		t.Errorf("allocs per send+receive = %v, want 0", a)
	}
	// Drain (run by the client's timer before a due deadline) is
	// allocation-free too, with and without datagrams queued.
	if a := testing.AllocsPerRun(500, func() { r.Drain(0) }); a != 0 {
		t.Errorf("allocs per empty Drain = %v, want 0", a)
	}
	drainTrip := func() {
		if err := r.SendCurrent(0, srv, pkt, 0); err != nil {
			t.Fatal(err)
		}
		// The echo comes through the reader or Drain; the bound only
		// stops a broken build from spinning forever.
		for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); {
			r.Drain(0)
			select {
			case <-got:
				return
			default:
				runtime.Gosched() // let the echo server and the reader run
			}
		}
		t.Fatal("echo not received within 30s")
	}
	if a := testing.AllocsPerRun(100, drainTrip); a != 0 {
		t.Errorf("allocs per send+drain = %v, want 0", a)
	}
}
