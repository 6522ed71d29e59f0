package proxy

import (
	"testing"
	"unsafe"

	"github.com/rl-tproxy/rl-tproxy/pkg/evloop"
)

// TestIdleConnSize guards the memory an idle keep-alive connection holds
// on a loop: its clientConn and its evloop.Sock (no buffer, no request state;
// the budget is 1 KiB of RSS per idle connection, and the Go heap
// roughly doubles what is live). A field added to either must fit the
// size class or pay for itself elsewhere.
func TestIdleConnSize(t *testing.T) {
	for _, tc := range []struct {
		name      string
		size, max uintptr
	}{
		{"clientConn", unsafe.Sizeof(clientConn{}), 288},
		{"evloop.Sock", unsafe.Sizeof(evloop.Sock{}), 176},
	} {
		if tc.size > tc.max {
			t.Errorf("%s is %d bytes, the idle budget allows %d", tc.name, tc.size, tc.max)
		}
	}
}
