//go:build !race

package realip

import (
	"net/netip"
	"testing"
)

func TestFromHeadersNoAlloc(t *testing.T) {
	tr := mustTrusted(t, "127.0.0.1/32", "10.0.0.0/8")
	peer := netip.MustParseAddr("127.0.0.1")
	xff := vals("198.51.100.9, 203.0.113.7, 10.0.0.1")
	fwd := vals(`for=198.51.100.9, for="[2001:db8:cafe::17]:4711";proto=https, for=10.0.0.1`)
	n := testing.AllocsPerRun(200, func() {
		tr.FromXFF(peer, xff)
		tr.FromForwarded(peer, fwd)
		tr.Contains(peer)
	})
	if n != 0 {
		t.Fatalf("%v allocations per request", n)
	}
}
