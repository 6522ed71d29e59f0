package h2proxy

import (
	"bytes"
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"github.com/rl-tproxy/rl-tproxy/internal/testkit"
)

// pattern is n bytes that differ by position, so reordering shows.
func pattern(seed, n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(seed*31 + i)
	}
	return b
}

// TestCoalescerOrderAndClose: writes of every size, queued faster than
// the peer reads, arrive complete and in order; Close sends what is
// pending before the connection ends.
func TestCoalescerOrderAndClose(t *testing.T) {
	a, b := net.Pipe()
	w := newCoalescer(a)
	var want bytes.Buffer
	got := make(chan []byte, 1)
	go func() {
		data, _ := io.ReadAll(b)
		got <- data
	}()
	for i, n := range []int{1, 9, 16 << 10, 0, 3, maxPending + 1, 70, 5} {
		p := pattern(i, n)
		want.Write(p)
		if m, err := w.Write(p); m != n || err != nil {
			t.Fatalf("write %d: %d, %v", i, m, err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case data := <-got:
		if !bytes.Equal(data, want.Bytes()) {
			t.Fatalf("peer read %d bytes, want %d (or out of order)", len(data), want.Len())
		}
	case <-time.After(30 * time.Second):
		t.Fatal("peer never saw the end of the connection")
	}
	<-w.done
	if _, err := w.Write([]byte("x")); !errors.Is(err, net.ErrClosed) {
		t.Errorf("write after close: %v", err)
	}
}

// TestCoalescerBackPressure: a peer that stops reading stalls the writer
// once maxPending bytes wait; memory does not grow with what is offered.
func TestCoalescerBackPressure(t *testing.T) {
	a, b := net.Pipe() // unbuffered: nothing leaves until b reads
	w := newCoalescer(a)
	defer w.Close()
	chunk := make([]byte, 32<<10)
	wrote := make(chan int, 1)
	go func() {
		n := 0
		for range 64 { // 2 MiB offered
			if _, err := w.Write(chunk); err != nil {
				break
			}
			n += len(chunk)
		}
		wrote <- n
	}()
	// Wait until the writer is stuck: nothing more is accepted.
	testkit.WaitFor(t, "the pending buffer to fill", func() bool {
		w.mu.Lock()
		defer w.mu.Unlock()
		return len(w.pending)+len(chunk) > maxPending
	})
	w.mu.Lock()
	held := len(w.pending)
	w.mu.Unlock()
	if held > maxPending {
		t.Fatalf("%d bytes pending, bound %d", held, maxPending)
	}
	select {
	case n := <-wrote:
		t.Fatalf("all %d bytes accepted by a peer that reads nothing", n)
	default:
	}
	// The peer reads again: everything arrives, the writer finishes.
	got := make(chan int64, 1)
	go func() { n, _ := io.Copy(io.Discard, b); got <- n }()
	if n := <-wrote; n != 64*len(chunk) {
		t.Fatalf("wrote %d", n)
	}
	_ = w.Close()
	<-w.done
	if n := <-got; n != int64(64*len(chunk)) {
		t.Errorf("peer read %d", n)
	}
}

// TestCoalescerPeerGone: after the peer closed, writes fail (the first
// error is sticky) instead of queueing forever.
func TestCoalescerPeerGone(t *testing.T) {
	a, b := net.Pipe()
	w := newCoalescer(a)
	_ = b.Close()
	var err error
	for i := 0; i < 1000 && err == nil; i++ {
		_, err = w.Write([]byte("data"))
		if err == nil {
			w.mu.Lock()
			for w.running {
				w.cond.Wait()
			}
			w.mu.Unlock()
		}
	}
	if err == nil {
		t.Fatal("writes to a closed peer keep succeeding")
	}
	if _, err2 := w.Write([]byte("more")); !errors.Is(err2, err) {
		t.Errorf("second error %v, first %v", err2, err)
	}
	_ = w.Close()
	<-w.done
}

// TestCoalescerCloseStuckPeer: Close of a connection whose peer reads
// nothing ends within the flush bound instead of holding it open.
func TestCoalescerCloseStuckPeer(t *testing.T) {
	a, _ := net.Pipe()
	w := newCoalescer(a)
	w.flushBound = 50 * time.Millisecond
	if _, err := w.Write(make([]byte, 1024)); err != nil {
		t.Fatal(err)
	}
	_ = w.Close()
	select {
	case <-w.done:
	case <-time.After(30 * time.Second):
		t.Fatal("a stuck peer held the connection open")
	}
}

// TestCoalescerLargeBatches: batches larger than the pending bound,
// written while the previous batch is still being sent, arrive intact
// (the buffer being sent is never the one writers append to), and an idle
// connection keeps no large buffer.
func TestCoalescerLargeBatches(t *testing.T) {
	a, b := net.Pipe()
	w := newCoalescer(a)
	got := make(chan []byte, 1)
	go func() {
		data, _ := io.ReadAll(b)
		got <- data
	}()
	var want bytes.Buffer
	sizes := []int{maxPending + 100, 1000, 70000, 5, 2*maxPending + 3, 64 << 10}
	for i := range 36 {
		p := pattern(i, sizes[i%len(sizes)])
		want.Write(p)
		if _, err := w.Write(p); err != nil {
			t.Fatalf("write %d: %v", i, err)
		}
	}
	testkit.WaitFor(t, "the writer to go idle", func() bool {
		w.mu.Lock()
		defer w.mu.Unlock()
		return !w.running
	})
	w.mu.Lock()
	if cap(w.pending) > maxSpare || cap(w.spare) > maxSpare {
		t.Errorf("idle connection keeps %d + %d bytes of buffer", cap(w.pending), cap(w.spare))
	}
	w.mu.Unlock()
	_ = w.Close()
	if data := <-got; !bytes.Equal(data, want.Bytes()) {
		t.Fatalf("peer read %d bytes, want %d (or corrupted)", len(data), want.Len())
	}
	<-w.done
}
