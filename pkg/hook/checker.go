package hook

import (
	"context"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rl-tproxy/rl-tproxy/pkg/admission"
	"github.com/rl-tproxy/rl-tproxy/pkg/ratelimitly"
	"github.com/rl-tproxy/rl-tproxy/pkg/ratelimitly/wire"
)

// checkerRef counts the requests using one checker so that a replaced
// checker is closed only after its in-flight requests (and their reports)
// are done.
type checkerRef struct {
	c       admission.Checker
	closer  io.Closer
	refs    atomic.Int64
	retired atomic.Bool
	once    sync.Once
	closed  chan struct{}
}

func (r *checkerRef) close() {
	r.once.Do(func() {
		if r.closer != nil {
			_ = r.closer.Close()
		}
		if r.closed != nil {
			close(r.closed)
		}
	})
}

// acquire returns the current checker with a reference held.
func (g *Gate) acquire() *checkerRef {
	for {
		ref := g.checker.Load()
		ref.refs.Add(1)
		if g.checker.Load() == ref {
			return ref
		}
		g.release(ref) // swapped meanwhile: retry with the new one
	}
}

// release drops a reference. The last one of a retired checker closes
// it, aside: release runs in Done, on a connection's goroutine or an
// event loop's thread, and closing can wait (an rlclient Client waits for
// a DNS query in flight, up to the resolver timeout).
func (g *Gate) release(ref *checkerRef) {
	if ref.refs.Add(-1) == 0 && ref.retired.Load() {
		go ref.close()
	}
}

// SetChecker installs c for requests that start from now on. The previous
// checker keeps serving the requests that already hold it and is closed
// (closer.Close, if it has a closer) once the last of them is done. The
// returned channel is closed when the previous checker has been closed.
func (g *Gate) SetChecker(c admission.Checker, closer io.Closer) <-chan struct{} {
	g.mu.Lock()
	defer g.mu.Unlock()
	old := g.checker.Swap(&checkerRef{c: c, closer: closer})
	old.closed = make(chan struct{})
	ch := old.closed
	old.retired.Store(true)
	if old.refs.Load() == 0 {
		old.close()
	}
	return ch
}

// Close retires the current checker (closing it once idle).
func (g *Gate) Close() <-chan struct{} { return g.SetChecker(noChecker{}, nil) }

// noChecker is the checker before one is installed: no endpoints.
type noChecker struct{}

func (noChecker) Check(_ context.Context, _ *wire.RateRequest, out *admission.CheckResult) {
	out.Valid, out.Fail = false, ratelimitly.CauseNoEndpoints
}

func (noChecker) Report([]byte, time.Duration) {}
