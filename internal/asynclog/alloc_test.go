//go:build !race

package asynclog

import (
	"io"
	"testing"
	"time"
)

// TestWriteAllocs: a log line costs no allocation on the caller's side
// (an event loop thread logging an access line).
func TestWriteAllocs(t *testing.T) {
	w := New(io.Discard, 0)
	defer w.Close(time.Minute)
	line := []byte("127.0.0.1 - - [02/Dec/2026:05:00:00 +0000] \"GET / HTTP/1.1\" 200 612 \"-\" \"wrk\"\n")
	if n := testing.AllocsPerRun(1000, func() { w.Write(line) }); n != 0 {
		t.Fatalf("%.1f allocations per Write", n)
	}
}
