// Package asynclog keeps log output off the data path: a Writer copies
// each write into a bounded buffer that one goroutine writes out, so a log
// consumer that stalls (a full pipe to a container runtime or journald, a
// terminal paused with ^S) costs lines, counted, instead of stopping the
// event loops that log access lines on their own threads.
package asynclog

import (
	"io"
	"sync"
	"sync/atomic"
	"time"
)

// DefaultSize is the buffer New uses when given size <= 0: about 3,000
// access lines, or some 60 ms of a busy loop's lines.
const DefaultSize = 1 << 20

// Writer is an io.Writer that never blocks on its destination. Each Write
// is kept whole or dropped whole (a slog handler writes one record per
// call, so lines are never torn). Safe for concurrent use.
type Writer struct {
	dst  io.Writer
	size int

	mu     sync.Mutex
	buf    []byte // lines waiting for the goroutine
	spare  []byte // the goroutine's buffer, swapped with buf
	closed bool

	wake    chan struct{} // cap 1: lines are waiting
	done    chan struct{} // the goroutine returned
	dropped atomic.Uint64 // writes dropped: the buffer was full
	errs    atomic.Uint64 // writes of the destination that failed
}

// New starts a Writer in front of dst holding at most size bytes (two
// buffers of size are allocated once).
func New(dst io.Writer, size int) *Writer {
	if size <= 0 {
		size = DefaultSize
	}
	w := &Writer{dst: dst, size: size, buf: make([]byte, 0, size), spare: make([]byte, 0, size),
		wake: make(chan struct{}, 1), done: make(chan struct{})}
	go w.run()
	return w
}

// Write queues p, or drops it when the buffer cannot take all of it (and
// when the Writer is closed). It always reports len(p), nil: a log line
// that cannot be kept is counted, not an error for the caller.
func (w *Writer) Write(p []byte) (int, error) {
	w.mu.Lock()
	if w.closed || len(w.buf)+len(p) > w.size {
		w.mu.Unlock()
		w.dropped.Add(1)
		return len(p), nil
	}
	w.buf = append(w.buf, p...)
	select { // under mu: Close closes wake
	case w.wake <- struct{}{}:
	default:
	}
	w.mu.Unlock()
	return len(p), nil
}

// Dropped returns the writes dropped so far.
func (w *Writer) Dropped() uint64 { return w.dropped.Load() }

// Errors returns the destination's failed writes so far.
func (w *Writer) Errors() uint64 { return w.errs.Load() }

func (w *Writer) run() {
	defer close(w.done)
	for {
		_, ok := <-w.wake
		w.mu.Lock()
		w.buf, w.spare = w.spare[:0], w.buf
		out := w.spare
		w.mu.Unlock()
		if len(out) > 0 {
			if _, err := w.dst.Write(out); err != nil {
				w.errs.Add(1)
			}
		}
		if !ok {
			return
		}
	}
}

// Close writes what is queued and stops the goroutine, waiting at most
// timeout for the destination (a stalled one keeps the rest: Close
// returns false then). Writes after Close are dropped.
func (w *Writer) Close(timeout time.Duration) bool {
	w.mu.Lock()
	if !w.closed {
		w.closed = true
		close(w.wake)
	}
	w.mu.Unlock()
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-w.done:
		return true
	case <-t.C:
		return false
	}
}
