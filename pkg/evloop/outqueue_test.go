package evloop

import (
	"bufio"
	"io"
	"net"
	"testing"

	"golang.org/x/sys/unix"
)

// TestWriteQueueStaysBounded streams 8 MiB to a reader that keeps up but
// stays window bytes behind (each chunk read, one more written), so the
// queue never empties. The queue's
// array must stay about the size of what is unsent: before reserve it
// grew by everything written since the queue last drained (the whole
// stream here, 630 MB of RSS for a 256 MiB download through the proxy).
// Every byte arrives in order, and every buffer is back with the loop
// once the stream drained.
func TestWriteQueueStaysBounded(t *testing.T) {
	const (
		chunk  = 8 << 10
		window = 512 << 10 // unread bytes the writer keeps ahead
		total  = 8 << 20
	)
	eachBackend(t, func(t *testing.T, be Backend) {
		g := startGroup(t, be, 1) // BufSize 4096: classes up to 256 KiB
		l := g.Loops()[0]
		addr, socks := accepted(t, g, func() Handler { return &funcHandler{} })
		c := dial(t, addr)
		// Small kernel buffers (no autotuning): the window cannot hide there.
		c.(*net.TCPConn).SetReadBuffer(16 << 10)
		s := <-socks
		on(l, func() {
			if err := unix.SetsockoptInt(s.FD(), unix.SOL_SOCKET, unix.SO_SNDBUF, 16<<10); err != nil {
				t.Error(err)
			}
		})
		buf := make([]byte, chunk)
		var written, maxCap, minPend int // loop thread only
		minPend = total
		write := func() {
			for i := range buf {
				buf[i] = byte((written + i) % 251)
			}
			s.Write(buf)
			written += chunk
			maxCap = max(maxCap, cap(s.out))
			if written > window && written < total {
				minPend = min(minPend, s.Pending())
			}
		}
		on(l, func() {
			for written < window {
				write()
			}
		})
		r := bufio.NewReaderSize(c, chunk)
		got := make([]byte, chunk)
		// Each read waits for the write it asks for, so the writer's lead
		// is the window at every read however late the loop runs.
		wrote := make(chan struct{}, 1)
		for off := 0; off < total; off += chunk {
			if _, err := io.ReadFull(r, got); err != nil {
				t.Fatalf("read at %d: %v", off, err)
			}
			for i, b := range got {
				if b != byte((off+i)%251) {
					t.Fatalf("byte %d is %d, want %d", off+i, b, (off+i)%251)
				}
			}
			l.Post(func() {
				if written < total {
					write()
				}
				wrote <- struct{}{}
			})
			<-wrote
		}
		t.Logf("max queue array %d bytes for %d streamed; least unsent mid-stream %d", maxCap, total, minPend)
		if minPend == 0 {
			t.Errorf("the queue emptied mid-stream: the test did not keep it busy")
		}
		if maxCap > 2*window {
			t.Errorf("queue array grew to %d bytes with at most %d unsent", maxCap, window)
		}
		waitStats(t, g, "every write buffer back with the loop", func(st Stats) bool { return st.Buffers == 0 })
	})
}
