package h2proxy_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/status"

	"github.com/rl-tproxy/rl-tproxy/internal/testkit"
	"github.com/rl-tproxy/rl-tproxy/pkg/exchange"
)

// admitTimeout is the services' admission timeout in these tests: a
// configured value, not a bound any assertion depends on.
const admitTimeout = 50 * time.Millisecond

// stuckHook decides in time only for the path fast. Otherwise its Admit
// waits until its context ends, or, with ignoreCtx, until release is
// closed whatever its context says; its late Decision would allow.
type stuckHook struct {
	ignoreCtx bool
	fast      string
	release   chan struct{}
	unblock   sync.Once
	pending   atomic.Int32 // Admit calls not returned yet
	noDL      atomic.Int32 // Admit calls whose context had no deadline

	mu      sync.Mutex
	dones   []exchange.Result
	rejects []string
}

// newStuckHook returns a stuckHook whose Admit calls end with t at the
// latest.
func newStuckHook(t *testing.T, ignoreCtx bool) *stuckHook {
	h := &stuckHook{ignoreCtx: ignoreCtx, fast: "/ok", release: make(chan struct{})}
	t.Cleanup(h.releaseAll)
	return h
}

// releaseAll lets every Admit call that ignores its context return.
func (h *stuckHook) releaseAll() { h.unblock.Do(func() { close(h.release) }) }

// clientBound bounds a client's wait in these tests: only a proxy that
// never answers meets it.
const clientBound = 20 * time.Second

func (h *stuckHook) Admit(ctx context.Context, r *exchange.Request) exchange.Decision {
	if _, ok := ctx.Deadline(); !ok {
		h.noDL.Add(1)
	}
	if string(r.Path) == h.fast {
		return exchange.Decision{Allow: true}
	}
	h.pending.Add(1)
	defer h.pending.Add(-1)
	if h.ignoreCtx {
		<-h.release
	} else {
		<-ctx.Done()
	}
	return exchange.Decision{Allow: true}
}

func (h *stuckHook) Done(_ *exchange.Request, _ *exchange.Decision, res *exchange.Result) {
	h.mu.Lock()
	h.dones = append(h.dones, *res)
	h.mu.Unlock()
}

func (h *stuckHook) Reject(_ *exchange.Service, _ netip.AddrPort, rule string, status int) {
	h.mu.Lock()
	h.rejects = append(h.rejects, fmt.Sprintf("%s %d", rule, status))
	h.mu.Unlock()
}

// results returns copies of the Done results and the rejections.
func (h *stuckHook) results() ([]exchange.Result, []string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]exchange.Result(nil), h.dones...), append([]string(nil), h.rejects...)
}

// TestAdmissionTimeout: a stream whose Decision does not come within the
// service's admission timeout is answered 503 (gRPC: UNAVAILABLE) while
// the Hook may still be blocked, reported as "admission-timeout", and
// gets Done exactly once, with AdmissionErr, when the Hook returns.
func TestAdmissionTimeout(t *testing.T) {
	for _, tc := range []struct {
		name            string
		ignoreCtx, grpc bool
		status          int // Done's Result.Status
	}{
		{"ctx", false, false, 503},
		{"ignores-ctx", true, false, 503},
		{"grpc-ctx", false, true, 200},
		{"grpc-ignores-ctx", true, true, 200},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newStuckHook(t, tc.ignoreCtx)
			svc := &exchange.Service{Name: "a", Upstream: "127.0.0.1:9", AdmissionTimeout: admitTimeout}
			_, addr := startProxy(t, svc, h)
			if tc.grpc {
				ctx, cancel := context.WithTimeout(context.Background(), clientBound)
				defer cancel()
				_, err := dialGRPC(t, addr).EmptyCall(ctx, &testgrpc.Empty{})
				if status.Code(err) != codes.Unavailable {
					t.Fatalf("gRPC call: %v, want UNAVAILABLE", err)
				}
			} else {
				cl := h2cClient()
				cl.Timeout = clientBound
				defer cl.CloseIdleConnections()
				if got := getStatus(t, cl, "http://"+addr+"/slow"); got != 503 {
					t.Fatalf("status %d, want 503", got)
				}
			}
			// The rejection is reported before the answer is written.
			dones, rejects := h.results()
			if len(rejects) != 1 || rejects[0] != "admission-timeout 503" {
				t.Fatalf("rejections %q", rejects)
			}
			if tc.ignoreCtx {
				// Answered while the Hook is still in Admit: no Done yet.
				if h.pending.Load() != 1 || len(dones) != 0 {
					t.Fatalf("answered with %d Admit calls pending and %d Done", h.pending.Load(), len(dones))
				}
				h.releaseAll()
			}
			testkit.WaitFor(t, "Done", func() bool { d, _ := h.results(); return len(d) > 0 })
			dones, _ = h.results()
			if len(dones) != 1 {
				t.Fatalf("Done %d times", len(dones))
			}
			res := dones[0]
			if !errors.Is(res.AdmissionErr, exchange.ErrAdmissionTimeout) || res.ClientAborted || res.Status != tc.status {
				t.Errorf("Result: AdmissionErr %v (want exchange.ErrAdmissionTimeout), ClientAborted %v, Status %d", res.AdmissionErr, res.ClientAborted, res.Status)
			}
			if h.noDL.Load() != 0 {
				t.Error("Admit's context had no deadline")
			}
		})
	}
}

// getStatus sends GET url and returns the response status.
func getStatus(t *testing.T, cl *http.Client, url string) int {
	t.Helper()
	res, err := cl.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, res.Body)
	_ = res.Body.Close()
	return res.StatusCode
}

// TestAdmissionTimeoutFlood: 100 streams on one connection whose
// admissions all time out together (half of them with a Hook that ignores
// its context) each get 503; the connection then still serves a stream
// the Hook admits, every stream gets Done once the Hook returned, and the
// streams' goroutines end.
func TestAdmissionTimeoutFlood(t *testing.T) {
	const streams = 100
	h := newStuckHook(t, false)
	ignoring := newStuckHook(t, true)
	hook := &pathHook{byPath: map[string]*stuckHook{"/wait": h, "/stuck": ignoring, "/ok": h}}
	up := startHTTP(t, true)
	svc := &exchange.Service{Name: "a", Upstream: up, AdmissionTimeout: admitTimeout}
	_, addr := startProxy(t, svc, hook)
	goroutines := runtime.NumGoroutine()
	cl, cc := h2cOneConn(t, h2cTransport(), addr)
	cl.Timeout = clientBound
	if n := getStatus(t, cl, "http://"+addr+"/ok"); n != 200 { // the connection is up
		t.Fatalf("status %d, want 200", n)
	}
	var wg sync.WaitGroup
	got := make([]int, streams)
	errs := make([]error, streams)
	for i := range streams {
		path := "/wait"
		if i%2 == 1 {
			path = "/stuck"
		}
		wg.Go(func() {
			res, err := cl.Get("http://" + addr + path)
			if err != nil {
				errs[i] = err
				return
			}
			_, _ = io.Copy(io.Discard, res.Body)
			_ = res.Body.Close()
			got[i] = res.StatusCode
		})
	}
	wg.Wait()
	for i := range streams {
		if errs[i] != nil || got[i] != 503 {
			t.Fatalf("stream %d: status %d, error %v", i, got[i], errs[i])
		}
	}
	if n := getStatus(t, cl, "http://"+addr+"/ok"); n != 200 {
		t.Errorf("after the flood: status %d, want 200", n)
	}
	if err := cc.Err(); err != nil {
		t.Errorf("the flood's connection: %v", err)
	}
	ignoring.releaseAll()
	testkit.WaitFor(t, "every Done", func() bool {
		a, _ := h.results()
		b, _ := ignoring.results()
		return len(a)+len(b) == streams+2
	})
	for _, sh := range []*stuckHook{h, ignoring} {
		dones, rejects := sh.results()
		timedOut := 0
		for _, r := range dones {
			if r.AdmissionErr != nil {
				timedOut++
			}
		}
		if timedOut != streams/2 || len(rejects) != 0 {
			t.Errorf("%d Done with AdmissionErr, want %d; rejections to the inner hook %q", timedOut, streams/2, rejects)
		}
	}
	_, rejects := hook.results()
	if len(rejects) != streams || strings.Count(strings.Join(rejects, ","), "admission-timeout 503") != streams {
		t.Errorf("%d rejections %q", len(rejects), rejects)
	}
	cl.CloseIdleConnections()
	testkit.WaitFor(t, "stream goroutines to end", func() bool { return runtime.NumGoroutine() <= goroutines+8 })
}

// pathHook hands each request to the stuckHook of its path and records
// the rejections itself (it is the Rejecter the proxy sees).
type pathHook struct {
	byPath map[string]*stuckHook
	stuckHook
}

func (p *pathHook) Admit(ctx context.Context, r *exchange.Request) exchange.Decision {
	return p.byPath[string(r.Path)].Admit(ctx, r)
}

func (p *pathHook) Done(r *exchange.Request, d *exchange.Decision, res *exchange.Result) {
	p.byPath[string(r.Path)].Done(r, d, res)
}
