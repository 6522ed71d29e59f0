//go:build !race

package h2proxy

import (
	"net"
	"testing"
)

// TestFrameGuardAlloc: following the frames read (the budget spent and
// earned back, a request's header block checked: fields from the HPACK
// tables, as a client's repeated requests are) and written (boundaries,
// DATA counted) allocates nothing.
func TestFrameGuardAlloc(t *testing.T) {
	client, server := net.Pipe()
	defer client.Close()
	defer server.Close()
	co := newCoalescer(server)
	co.fw = &frameWriter{w: co}
	var g frameGuard
	g.init(co.fw)
	g.skip = 0
	g.hb.init(4096, 16<<10)
	in := append(frameBytes(frameHeaders, flagEndHeaders, 1, []byte{0x82, 0x86}),
		frameBytes(frameWindowUpdate, 0, 0, []byte{0, 0, 0, 1})...)
	in = append(in, frameBytes(frameSettings, 0, 0, settingsPayload(4, 1, 4, 2))...)
	out := frameBytes(frameData, 0, 1, make([]byte, 100))
	allocs := testing.AllocsPerRun(200, func() {
		if !g.scan(in) || g.hb.broken {
			t.Fatal("flooded, or the block not decoded")
		}
		co.mu.Lock()
		_ = co.fw.cut(out)
		co.mu.Unlock()
		dedupSettings(in[len(in)-12:])
	})
	if allocs != 0 {
		t.Fatalf("%v allocations per run", allocs)
	}
}
