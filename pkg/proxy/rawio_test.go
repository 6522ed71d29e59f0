package proxy

import (
	"io"
	"net"
	"syscall"
	"testing"
	"time"
)

func tcpPair(t *testing.T) (a, b net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	a, err = net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	b, err = ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close(); b.Close() })
	return a, b
}

func rawOf(t *testing.T, c net.Conn) syscall.RawConn {
	t.Helper()
	raw, err := c.(syscall.Conn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	return raw
}

// TestWriteTimeout: a write that goes out at once succeeds whatever the
// old deadline; one the peer never drains fails with a timeout.
func TestWriteTimeout(t *testing.T) {
	a, b := tcpPair(t)
	var w sockWriter
	w.init()
	a.SetWriteDeadline(aLongTimeAgo) // a stale deadline must not matter
	msg := []byte("hello")
	if n, err := w.writeTimeout(a, rawOf(t, a), msg, time.Minute); err != nil || n != len(msg) {
		t.Fatalf("small write: %d %v", n, err)
	}
	got := make([]byte, len(msg))
	if _, err := io.ReadFull(b, got); err != nil || string(got) != "hello" {
		t.Fatalf("read %q %v", got, err)
	}
	// b never reads: the socket buffers fill and the write must time out.
	big := make([]byte, 64<<20)
	n, err := w.writeTimeout(a, rawOf(t, a), big, 50*time.Millisecond)
	if !isTimeout(err) || n >= len(big) {
		t.Fatalf("stalled write: %d %v", n, err)
	}
	// A broken peer surfaces as a write error.
	b.Close()
	var werr error
	for i := 0; i < 100 && werr == nil; i++ {
		_, werr = w.writeTimeout(a, rawOf(t, a), msg, time.Minute)
	}
	if werr == nil {
		t.Fatal("writes to a closed peer kept succeeding")
	}
}
