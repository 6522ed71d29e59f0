//go:build !race

// Allocation tests (testing.AllocsPerRun). Their counts are meaningless
// under -race (the detector allocates, sync.Pool drops items), so this file
// is left out of the race run and `make test-alloc` runs it without -race.
// Every test here has "Alloc" in its name: that pass selects them by it.

package wire

import "testing"

func TestZeroAllocs(t *testing.T) {
	k := testKey(t, 1, 0)
	req := sampleRequest()
	buf := make([]byte, 0, MaxDatagram)
	var h, got Header
	var out RateRequest
	var pkt []byte
	// warm up
	pkt, _ = k.Seal(buf, &h, req)
	_ = k.OpenBody(pkt, &got, &out)
	allocs := testing.AllocsPerRun(200, func() {
		h = sampleHeader()
		p, err := k.Seal(buf[:0], &h, req)
		if err != nil {
			t.Fatal(err)
		}
		if err := k.OpenBody(p, &got, &out); err != nil {
			t.Fatal(err)
		}
	})
	if allocs != 0 {
		t.Fatalf("%v allocs per seal+open", allocs)
	}
}
