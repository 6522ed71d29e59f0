package h2proxy

import (
	"net"
	"runtime"
	"sync"
	"time"
)

// coalescer batches the writes of one connection into fewer write system
// calls. The HTTP/2 codec flushes its buffer once per response on the
// client side and once per request on the upstream side, so under load
// every stream costs at least two write(2)s, and on loopback TCP a write
// also runs the receiver's network stack. A coalescer's Write copies into
// a pending buffer and returns; a writer goroutine, started when the
// buffer goes from empty to not empty and ending when it is empty again,
// sends the buffer: the flushes of the streams that ran while it waited
// for the CPU (or for its last write to finish) leave in one write. An
// idle connection's write leaves at once; an idle connection holds no
// goroutine.
//
// Write blocks while maxPending bytes wait besides the batch being
// written (back pressure: a peer that does not read stalls its writers
// as a full socket buffer would). The
// first write error is sticky: every later Write returns it. Close sends
// what is pending (within flushBound), then closes the connection;
// done is closed once the connection is closed.
type coalescer struct {
	net.Conn

	mu      sync.Mutex
	cond    sync.Cond // signalled when the pending buffer drains or the writer ends
	pending []byte
	spare   []byte
	err     error
	running bool // a writer goroutine owns the flush
	closing bool
	done    chan struct{}
	once    sync.Once
	// flushBound bounds how long Close waits for a peer to take what
	// is pending (closeFlushTimeout).
	flushBound time.Duration
	// fw follows the frames written on a client connection, so that the
	// proxy's own frames (the flood guard's GOAWAY, the header checks'
	// RST_STREAM) go in at a frame boundary; nil upstream.
	fw *frameWriter
}

const (
	maxPending        = 256 << 10
	maxSpare          = 32 << 10 // larger buffers are not kept for the next batch
	closeFlushTimeout = 5 * time.Second
)

func newCoalescer(c net.Conn) *coalescer {
	w := &coalescer{Conn: c, done: make(chan struct{}), flushBound: closeFlushTimeout}
	w.cond.L = &w.mu
	return w
}

// Write queues p; it returns once p is copied.
func (w *coalescer) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	n := len(p)
	if w.fw != nil && w.fw.sealed { // after a GOAWAY of the flood guard's
		return n, nil
	}
	for w.err == nil && !w.closing && len(w.pending) > 0 && len(w.pending)+len(p) > maxPending {
		w.cond.Wait()
	}
	if w.err != nil {
		return 0, w.err
	}
	if w.closing {
		return 0, net.ErrClosed
	}
	if w.fw == nil {
		w.pending = append(w.pending, p...)
	} else {
		for len(p) > 0 && !w.fw.sealed {
			k := w.fw.cut(p)
			w.pending = append(w.pending, p[:k]...)
			p = p[k:]
			if w.fw.due != nil && w.fw.atBoundary() {
				w.pending = append(w.pending, w.fw.due...)
				w.fw.due, w.fw.sealed = nil, w.fw.sealDue
			}
		}
	}
	w.kick()
	return n, nil
}

// kick starts the writer goroutine if it is not running (w.mu held).
func (w *coalescer) kick() {
	if !w.running {
		w.running = true
		go w.flush()
	}
}

// injectAtBoundary queues b (whole frames) after the frame being
// written: at once when the bytes written so far end with a whole frame,
// else by the Write that completes the frame. With seal (b ends with a
// GOAWAY), nothing written after b goes out.
func (w *coalescer) injectAtBoundary(b []byte, seal bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.fw == nil || w.fw.sealed || w.closing || w.err != nil {
		return
	}
	if !w.fw.atBoundary() {
		w.fw.due = append(w.fw.due, b...)
		w.fw.sealDue = w.fw.sealDue || seal
		return
	}
	w.pending = append(w.pending, b...)
	w.fw.sealed = seal
	w.kick()
}

// flush is the writer goroutine: it sends the pending buffer until it
// stays empty, then ends (closing the connection if Close was called).
//
// It yields once before its first write. A goroutine that was just
// started or woken runs next on its P, before the goroutines already
// runnable there: the writer would send the first stream's frames alone
// while the streams readied by the same read (their handlers, the
// codec's loops) had not yet queued theirs. Yielding puts it behind them
// (the global run queue, taken when the P has nothing else or every 61st
// turn, so the wait is bounded), and their writes join the batch: under
// h2load ~1 write(2) per request became ~0.15, each a wakeup of the peer
// and a pass through the loopback stack. An idle process runs the writer
// at once.
func (w *coalescer) flush() {
	runtime.Gosched()
	w.mu.Lock()
	for len(w.pending) > 0 && w.err == nil {
		out := w.pending
		w.pending = w.spare[:0]
		w.cond.Broadcast() // room again for writers waiting on a full buffer
		w.mu.Unlock()
		_, err := w.Conn.Write(out)
		w.mu.Lock()
		w.spare = nil // never the array pending now uses
		if cap(out) <= maxSpare {
			w.spare = out[:0]
		}
		if err != nil {
			w.err = err
			w.pending = nil
		}
		w.cond.Broadcast()
	}
	w.running = false
	if cap(w.pending) > maxSpare { // an idle connection keeps small buffers only
		w.pending = nil
	}
	closing := w.closing
	w.mu.Unlock()
	if closing {
		w.closeNow()
	}
}

func (w *coalescer) closeNow() {
	w.mu.Lock()
	sealed := w.fw != nil && w.fw.sealed
	w.mu.Unlock()
	if sealed {
		// The proxy's GOAWAY went last: a FIN and a bounded drain of
		// what the client still sends, so that a close with unread
		// bytes does not become a reset that overtakes the GOAWAY.
		go func() {
			lingerClose(w.Conn)
			close(w.done)
		}()
		return
	}
	_ = w.Conn.Close()
	close(w.done)
}

// Close sends what is pending, then closes the connection. It returns at
// once; done tells when the connection is closed.
func (w *coalescer) Close() error {
	w.once.Do(func() {
		w.mu.Lock()
		w.closing = true
		running := w.running
		if running {
			// A peer that stopped reading must not hold the
			// connection open.
			_ = w.Conn.SetWriteDeadline(time.Now().Add(w.flushBound))
		}
		w.cond.Broadcast()
		w.mu.Unlock()
		if !running {
			w.closeNow()
		}
	})
	return nil
}
