package proxy

import (
	"context"
	"errors"
	"net"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rl-tproxy/rl-tproxy/internal/testkit"
	"github.com/rl-tproxy/rl-tproxy/pkg/exchange"
)

// admitTimeoutShort is the admission timeout of these tests: what the
// hook never answers within. It bounds nothing the tests assert.
const admitTimeoutShort = 50 * time.Millisecond

// A Hook that never answers does not hold the connection: once
// Config.AdmissionTimeout passed the admission is cancelled (once), the
// client gets 503 and the connection closes; the request reaches neither
// the upstream nor, until the Hook answers after all, Done, which then
// sees Result.AdmissionErr (not a client abort).
func TestAdmissionTimeout(t *testing.T) {
	cases := []struct {
		name string
		// hook returns the Hook under test; answer checks how it was
		// cancelled and makes it answer the timed-out admission (a
		// never-answering hook does only when the test says so); unblock
		// makes it answer whatever is pending (idempotent).
		hook func(t *testing.T) (h exchange.Hook, th *testHook, answer, unblock func())
	}{
		{"async-never-resumes", func(t *testing.T) (exchange.Hook, *testHook, func(), func()) {
			h := &holdHook{testHook: newTestHook(nil), begun: make(chan struct{}, 1)}
			resume := func() {
				h.mu.Lock()
				defer h.mu.Unlock()
				for _, pd := range h.pending {
					*pd.d = exchange.Decision{Allow: true}
					pd.res.Resume()
				}
				h.pending = nil
			}
			return h, h.testHook, func() {
				if n := h.cancels.Load(); n != 1 {
					t.Errorf("Cancel called %d times, want once", n)
				}
				resume()
			}, resume
		}},
		{"async-resumes-from-cancel", func(t *testing.T) (exchange.Hook, *testHook, func(), func()) {
			h := newAsyncTestHook()
			return h, h.testHook, func() {
				if p := recvWithin(t, h.cancels, "Cancel"); p != "/" {
					t.Errorf("Cancel for %q", p)
				}
			}, func() {}
		}},
		{"blocking-honours-context", func(t *testing.T) (exchange.Hook, *testHook, func(), func()) {
			var ctxErr atomic.Value
			var hasDeadline atomic.Bool
			stop := make(chan struct{})
			th := newTestHook(func(ctx context.Context, r *exchange.Request) exchange.Decision {
				_, ok := ctx.Deadline()
				hasDeadline.Store(ok)
				select {
				case <-ctx.Done(): // the admission timeout ends it
					ctxErr.Store(ctx.Err())
				case <-stop: // the test failed early
				}
				return exchange.Decision{Allow: true}
			})
			var once sync.Once
			return th, th, func() {
				if !hasDeadline.Load() {
					t.Error("Admit's context has no deadline")
				}
				testkit.WaitFor(t, "Admit to return", func() bool { return ctxErr.Load() != nil })
				if err := ctxErr.Load().(error); !errors.Is(err, context.DeadlineExceeded) {
					t.Errorf("Admit's context ended with %v, want the deadline", err)
				}
			}, func() { once.Do(func() { close(stop) }) }
		}},
		{"blocking-ignores-context", func(t *testing.T) (exchange.Hook, *testHook, func(), func()) {
			release := make(chan struct{})
			th := newTestHook(func(context.Context, *exchange.Request) exchange.Decision {
				<-release // the test's answer: the hook ignores its context
				return exchange.Decision{Allow: true}
			})
			var once sync.Once
			answer := func() { once.Do(func() { close(release) }) }
			return th, th, answer, answer
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			base := runtime.NumGoroutine()
			up := newRawUpstream(t, func(int, net.Conn) {})
			hook, th, answer, unblock := tc.hook(t)
			p, addr := startProxy(t, th, &exchange.Service{Upstream: up.addr()}, func(cfg *Config) {
				cfg.Hook = hook
				cfg.AdmissionTimeout = admitTimeoutShort
			})
			t.Cleanup(unblock) // before Shutdown: a test that failed early must not hang it
			c := dialClient(t, addr)
			c.send("GET / HTTP/1.1\r\nHost: x\r\n\r\n")
			r, body := c.resp("GET")
			if r.StatusCode != 503 || !r.Close || body != "503 Service Unavailable\n" {
				t.Fatalf("answer %d %q (close %v), want 503 with Connection: close", r.StatusCode, body, r.Close)
			}
			c.expectClosed()
			answer()
			d := th.waitDone(t)
			if d.status != 503 || d.clientAborted || !errors.Is(d.admissionErr, exchange.ErrAdmissionTimeout) || !isTimeout(d.admissionErr) {
				t.Fatalf("done %+v, want status 503 with an AdmissionErr that is exchange.ErrAdmissionTimeout", d)
			}
			if up.count() != 0 {
				t.Fatal("a request whose admission timed out reached the upstream")
			}
			testkit.WaitFor(t, "the connection to be released", func() bool {
				return p.Stats().Conns == 0 && p.lg.workers.busy.Load() == 0
			})
			c.c.Close()
			up.ln.Close()
			noLeakAbove(t, base)
		})
	}
}

// noLeakAbove is noLeak allowing for the admission worker goroutines,
// which outlive their job for admitWorkerIdle.
func noLeakAbove(t *testing.T, base int) {
	t.Helper()
	testkit.WaitFor(t, "goroutines to settle", func() bool { return runtime.NumGoroutine() <= base+4 })
}

// Shutdown's deadline is not held up for ever by a Hook that never
// answers: the connection waiting for it is closed, and Shutdown returns
// the deadline's error after at most forcedWait more, not after the
// Decision.
func TestShutdownForcedDoesNotWaitForeverForHook(t *testing.T) {
	up := newRawUpstream(t, func(int, net.Conn) {})
	h := &holdHook{testHook: newTestHook(nil), begun: make(chan struct{}, 1)}
	// The hook is not passed as a *testHook: its Done never comes, which
	// startProxy's cleanup would count as an imbalance.
	p, addr := startProxy(t, nil, &exchange.Service{Upstream: up.addr()}, func(cfg *Config) { cfg.Hook = h })
	resume := func() {
		h.mu.Lock()
		defer h.mu.Unlock()
		for _, pd := range h.pending {
			*pd.d = exchange.Decision{Allow: true}
			pd.res.Resume()
		}
		h.pending = nil
	}
	t.Cleanup(resume) // a broken build's Shutdown waits for it: fail, not hang
	c := dialClient(t, addr)
	c.send("GET / HTTP/1.1\r\nHost: x\r\n\r\n")
	recvWithin(t, h.begun, "Begin")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer cancel()
	shut := make(chan error, 1)
	go func() { shut <- p.Shutdown(ctx) }()
	if err := recvWithin(t, shut, "Shutdown to return"); err != context.DeadlineExceeded {
		t.Fatalf("Shutdown: %v, want the deadline's error", err)
	}
	c.expectClosed()
	if n := h.cancels.Load(); n != 1 {
		t.Fatalf("Cancel called %d times, want once", n)
	}
	resume() // too late: the stopped loop drops it
}
