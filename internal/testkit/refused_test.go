package testkit

import (
	"errors"
	"net"
	"syscall"
	"testing"
)

// TestRefusedAddr: a connect is refused, and a listener asking for that
// very port cannot have it while the test runs.
func TestRefusedAddr(t *testing.T) {
	addr := RefusedAddr(t)
	if _, err := net.Dial("tcp", addr); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("dial %s: %v, want connection refused", addr, err)
	}
	if ln, err := net.Listen("tcp", addr); err == nil {
		ln.Close()
		t.Fatalf("listen %s succeeded: the port is not held", addr)
	}
}
