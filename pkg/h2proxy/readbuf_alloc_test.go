//go:build !race

package h2proxy

import (
	"io"
	"testing"
)

// TestReadBufAlloc: reading frames through the buffer allocates nothing
// once the pool has a buffer (the read(2) callback is bound once per
// connection).
func TestReadBufAlloc(t *testing.T) {
	peer, c := tcpPair(t)
	var rb readBuf
	rb.init(c, c)
	frames := pattern(1, 2*(9+40))
	hdr, payload := make([]byte, 9), make([]byte, 40)
	r := readerFunc(rb.read)
	allocs := testing.AllocsPerRun(200, func() {
		if _, err := peer.Write(frames); err != nil {
			t.Fatal(err)
		}
		for range 2 {
			if _, err := io.ReadFull(r, hdr); err != nil {
				t.Fatal(err)
			}
			if _, err := io.ReadFull(r, payload); err != nil {
				t.Fatal(err)
			}
		}
	})
	if allocs != 0 {
		t.Fatalf("%.1f allocations per two frames, want 0", allocs)
	}
}
