package asynclog

import (
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rl-tproxy/rl-tproxy/internal/testkit"
)

// gate blocks every Write until open is closed: a stalled log consumer.
type gate struct {
	open chan struct{}
	testkit.SyncBuffer
}

func (g *gate) Write(p []byte) (int, error) {
	<-g.open
	return g.SyncBuffer.Write(p)
}

// TestLinesInOrderAndWhole: concurrent writers, each line arrives once,
// whole, and each writer's lines in its order.
func TestLinesInOrderAndWhole(t *testing.T) {
	dst := &testkit.SyncBuffer{}
	w := New(dst, 0)
	const writers, lines = 8, 500
	var wg sync.WaitGroup
	for i := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range lines {
				fmt.Fprintf(w, "w%d line %d end\n", i, j)
			}
		}()
	}
	wg.Wait()
	if !w.Close(time.Minute) {
		t.Fatal("Close did not finish")
	}
	if d := w.Dropped(); d != 0 {
		t.Fatalf("%d lines dropped with a destination that keeps up", d)
	}
	next := make([]int, writers)
	got := strings.Split(strings.TrimSuffix(dst.String(), "\n"), "\n")
	for _, l := range got {
		var i, j int
		if _, err := fmt.Sscanf(l, "w%d line %d end", &i, &j); err != nil || i < 0 || i >= writers {
			t.Fatalf("torn or foreign line %q", l)
		}
		if j != next[i] {
			t.Fatalf("writer %d: line %d after %d", i, j, next[i]-1)
		}
		next[i]++
	}
	if len(got) != writers*lines {
		t.Fatalf("%d lines arrived, want %d", len(got), writers*lines)
	}
}

// TestStalledDestination: while the destination blocks, Write returns at
// once; what does not fit the buffer is dropped whole and counted; once
// the destination moves, every kept line arrives, whole and in order.
func TestStalledDestination(t *testing.T) {
	g := &gate{open: make(chan struct{})}
	const size = 4096
	w := New(g, size)
	line := func(i int) string { return fmt.Sprintf("line %04d %s\n", i, strings.Repeat("x", 80)) }
	const n = 1000 // ~94 KB: far more than the buffer and the blocked write hold
	for i := range n {
		w.Write([]byte(line(i))) // returns: the test would hang here otherwise
	}
	if w.Dropped() == 0 {
		t.Fatalf("no line dropped: %d bytes written into a %d-byte buffer of a stalled writer", n*len(line(0)), size)
	}
	close(g.open)
	if !w.Close(time.Minute) {
		t.Fatal("Close did not finish once the destination moved")
	}
	got := strings.Split(strings.TrimSuffix(g.String(), "\n"), "\n")
	if uint64(len(got))+w.Dropped() != n {
		t.Fatalf("%d lines arrived + %d dropped != %d written", len(got), w.Dropped(), n)
	}
	last := -1
	for _, l := range got {
		var i int
		if _, err := fmt.Sscanf(l, "line %d", &i); err != nil || l+"\n" != line(i) || i <= last {
			t.Fatalf("line %q after %d: torn, foreign or out of order", l, last)
		}
		last = i
	}
}

// TestCloseWithStalledDestination: Close gives up after its timeout when
// the destination never returns, and later writes are dropped.
func TestCloseWithStalledDestination(t *testing.T) {
	g := &gate{open: make(chan struct{})}
	defer close(g.open)
	w := New(g, 1024)
	w.Write([]byte("stuck\n"))
	if w.Close(time.Millisecond) {
		t.Fatal("Close reported done while the destination blocks")
	}
	before := w.Dropped()
	w.Write([]byte("after close\n"))
	if w.Dropped() != before+1 {
		t.Fatalf("a write after Close was not dropped (%d, %d)", before, w.Dropped())
	}
}

// failing is a destination that refuses every write (a closed pipe).
type failing struct{ n int }

func (f *failing) Write(p []byte) (int, error) { f.n++; return 0, fmt.Errorf("broken pipe") }

func TestDestinationErrorsCounted(t *testing.T) {
	f := &failing{}
	w := New(f, 0)
	w.Write([]byte("a\n"))
	if !w.Close(time.Minute) {
		t.Fatal("Close")
	}
	if w.Errors() == 0 || f.n == 0 {
		t.Fatalf("errors %d after %d refused writes", w.Errors(), f.n)
	}
}
