package proxy

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/rl-tproxy/rl-tproxy/pkg/evloop"
	"github.com/rl-tproxy/rl-tproxy/pkg/exchange"

	"github.com/rl-tproxy/rl-tproxy/internal/testkit"
)

// testAttacher records on which goroutine each loop was attached and
// detached; on each loop it watches a pipe (a loop-thread operation),
// which detach stops and closes. failOn >= 0 makes that loop's attach fail.
type testAttacher struct {
	p      *Proxy // when set, detach checks that the proxy has no connection left
	failOn int

	mu         sync.Mutex
	attachG    map[int]uint64 // loop ID -> goroutine of AttachLoop
	detachG    map[int]uint64 // loop ID -> goroutine of detach
	detaches   map[int]int    // loop ID -> detach calls
	connsAtEnd []int
}

func newTestAttacher(failOn int) *testAttacher {
	return &testAttacher{failOn: failOn, attachG: map[int]uint64{}, detachG: map[int]uint64{}, detaches: map[int]int{}}
}

func (a *testAttacher) AttachLoop(l *evloop.Loop) (func(), error) {
	id := l.ID()
	if id == a.failOn {
		return nil, fmt.Errorf("refused on purpose")
	}
	var fds [2]int
	if err := unix.Pipe2(fds[:], unix.O_NONBLOCK|unix.O_CLOEXEC); err != nil {
		return nil, err
	}
	w, err := l.Watch(fds[0], func() {})
	if err != nil {
		unix.Close(fds[0])
		unix.Close(fds[1])
		return nil, err
	}
	a.mu.Lock()
	a.attachG[id] = testkit.GoroutineID()
	a.mu.Unlock()
	return func() {
		w.Stop()
		unix.Close(fds[0])
		unix.Close(fds[1])
		a.mu.Lock()
		defer a.mu.Unlock()
		a.detachG[id] = testkit.GoroutineID()
		a.detaches[id]++
		if a.p != nil {
			a.connsAtEnd = append(a.connsAtEnd, a.p.Stats().Conns)
		}
	}, nil
}

func (a *testAttacher) attached() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.attachG)
}

// loopGoroutines returns the goroutine id of every loop of p.
func loopGoroutines(t *testing.T, p *Proxy) map[int]uint64 {
	t.Helper()
	out := map[int]uint64{}
	var mu sync.Mutex
	p.lg.each(func(ls *loopState) {
		mu.Lock()
		out[ls.l.ID()] = testkit.GoroutineID()
		mu.Unlock()
	})
	return out
}

func getOK(t *testing.T, addr string) {
	t.Helper()
	c := dialClient(t, addr)
	c.send("GET /x HTTP/1.1\r\nHost: x\r\n\r\n")
	if r, _ := c.resp("GET"); r.StatusCode != 200 {
		t.Fatalf("status %d", r.StatusCode)
	}
	c.c.Close()
}

// TestAttach attaches to running loops: AttachLoop runs at once on each
// loop's goroutine, and Shutdown detaches on the same goroutine once
// the connections are gone.
func TestAttach(t *testing.T) {
	up := httpUpstream(t, http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	a := newTestAttacher(-1)
	var atAdmit atomic.Int64
	hook := newTestHook(func(context.Context, *exchange.Request) exchange.Decision {
		atAdmit.Store(int64(a.attached()))
		return exchange.Decision{Allow: true}
	})
	p, addr := startProxy(t, hook, &exchange.Service{Upstream: up}, func(cfg *Config) { cfg.EventLoops = 2 })
	a.p = p
	getOK(t, addr) // the loops run
	if err := p.Attach(a); err != nil {
		t.Fatal(err)
	}
	if n := a.attached(); n != 2 {
		t.Fatalf("attached to %d loops, want 2", n)
	}
	getOK(t, addr)
	if n := atAdmit.Load(); n != 2 {
		t.Fatalf("a request was admitted with %d loops attached", n)
	}
	loopsG := loopGoroutines(t, p)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := p.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	for id, g := range loopsG {
		if a.attachG[id] != g || a.detachG[id] != g || a.detaches[id] != 1 {
			t.Errorf("loop %d (goroutine %d): attached on %d, detached %d times on %d",
				id, g, a.attachG[id], a.detaches[id], a.detachG[id])
		}
	}
	for _, n := range a.connsAtEnd {
		if n != 0 {
			t.Errorf("detached with %d connections open", n)
		}
	}
}

// TestAttachBeforeServe attaches before the loops start: they run
// AttachLoop before accepting, and a failing attach fails Serve, with
// the loops already attached detached.
func TestAttachBeforeServe(t *testing.T) {
	for _, failOn := range []int{-1, 1} {
		t.Run(fmt.Sprintf("fail_on=%d", failOn), func(t *testing.T) {
			p, err := New(Config{Config: exchange.Config{Services: []*exchange.Service{{Name: "web", Upstream: "127.0.0.1:1"}}}, EventLoops: 2})
			if err != nil {
				t.Fatal(err)
			}
			a := newTestAttacher(failOn)
			a.p = p
			if err := p.Attach(a); err != nil {
				t.Fatal(err)
			}
			if n := a.attached(); n != 0 {
				t.Fatalf("attached to %d loops before they started", n)
			}
			ln, err := Listen(context.Background(), "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			defer ln.Close()
			served := make(chan error, 1)
			go func() { served <- p.Serve(ln, p.Config().Services[0]) }()
			if failOn >= 0 {
				select {
				case err = <-served:
				case <-time.After(10 * time.Second):
					t.Fatal("Serve did not fail")
				}
				if err == nil || !strings.Contains(err.Error(), "event loop 1") || !strings.Contains(err.Error(), "refused on purpose") {
					t.Fatalf("Serve: %v", err)
				}
			} else {
				// A connection is accepted only after AttachLoop ran on every loop.
				c := dialClient(t, ln.Addr().String())
				c.send("GET / HTTP/1.1\r\nHost: x\r\n\r\n")
				c.resp("GET") // 502: nothing listens upstream
				c.c.Close()
				if n := a.attached(); n != 2 {
					t.Fatalf("served with %d loops attached", n)
				}
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if err := p.Shutdown(ctx); err != nil {
				t.Fatal(err)
			}
			if failOn < 0 {
				if err := <-served; err != ErrClosed {
					t.Fatalf("Serve: %v", err)
				}
			}
			a.mu.Lock()
			defer a.mu.Unlock()
			want1 := 1
			if failOn == 1 {
				want1 = 0
			}
			if a.detaches[0] != 1 || a.detaches[1] != want1 {
				t.Fatalf("detach calls by loop: %v", a.detaches)
			}
			if err := p.Attach(newTestAttacher(-1)); !errors.Is(err, ErrClosed) {
				t.Fatalf("Attach after Shutdown: %v", err)
			}
		})
	}
}

// TestAttachErrorRollsBack attaches to running loops with one loop
// failing: the other loop is detached at once (and not again at
// Shutdown), and the proxy keeps serving.
func TestAttachErrorRollsBack(t *testing.T) {
	up := httpUpstream(t, http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	p, addr := startProxy(t, nil, &exchange.Service{Upstream: up}, func(cfg *Config) { cfg.EventLoops = 2 })
	getOK(t, addr)
	a := newTestAttacher(1)
	err := p.Attach(a)
	if err == nil || !strings.Contains(err.Error(), "event loop 1") {
		t.Fatalf("Attach: %v", err)
	}
	a.mu.Lock()
	if a.detaches[0] != 1 || a.detaches[1] != 0 {
		t.Fatalf("after a failed Attach, detach calls by loop: %v", a.detaches)
	}
	a.mu.Unlock()
	getOK(t, addr)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := p.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.detaches[0] != 1 {
		t.Fatalf("a rolled-back attach was detached again at Shutdown: %v", a.detaches)
	}
}

// TestDetach undoes an Attach while the loops run (an attacher replaced on
// reload): its detach runs at once on each loop's goroutine, the proxy
// forgets it (Shutdown does not detach it again, a second Detach does
// nothing), and the other attachers stay attached.
func TestDetach(t *testing.T) {
	up := httpUpstream(t, http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	p, addr := startProxy(t, nil, &exchange.Service{Upstream: up}, func(cfg *Config) { cfg.EventLoops = 2 })
	getOK(t, addr) // the loops run
	gone, kept := newTestAttacher(-1), newTestAttacher(-1)
	for _, a := range []*testAttacher{gone, kept} {
		if err := p.Attach(a); err != nil {
			t.Fatal(err)
		}
	}
	loopsG := loopGoroutines(t, p)
	p.Detach(gone)
	p.Detach(gone)
	p.Detach(newTestAttacher(-1)) // never attached: nothing to do
	check := func(a *testAttacher, want int) {
		t.Helper()
		a.mu.Lock()
		defer a.mu.Unlock()
		for id, g := range loopsG {
			if a.detaches[id] != want || want > 0 && a.detachG[id] != g {
				t.Errorf("loop %d (goroutine %d): detached %d times (want %d) on %d", id, g, a.detaches[id], want, a.detachG[id])
			}
		}
	}
	check(gone, 1)
	check(kept, 0)
	getOK(t, addr) // the loops keep serving
	if n := p.Stats().Attached; n != 1 {
		t.Fatalf("%d attachers registered, want 1", n)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := p.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	check(gone, 1)
	check(kept, 1)
	p.Detach(kept) // after Shutdown: nothing left to do
	check(kept, 1)
}
