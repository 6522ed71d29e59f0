package proxy

import (
	"context"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rl-tproxy/rl-tproxy/internal/testkit"
	"github.com/rl-tproxy/rl-tproxy/pkg/exchange"
)

// holdHook is an AsyncHook that leaves every request pending and does
// not resume from Cancel: the test resumes later (a check whose answer is
// still on its way when the client leaves).
type holdHook struct {
	*testHook
	mu      sync.Mutex
	pending []asyncPending
	begun   chan struct{}
	cancels atomic.Int32
}

func (h *holdHook) Begin(r *exchange.Request, d *exchange.Decision, res Resumer) bool {
	h.testHook.pending.Add(1)
	h.mu.Lock()
	h.pending = append(h.pending, asyncPending{d, res})
	h.mu.Unlock()
	h.begun <- struct{}{}
	return false
}

func (h *holdHook) Cancel(*exchange.Request) { h.cancels.Add(1) }

// AsyncHook.Cancel is called at most once per Begin (async.go), also when
// Shutdown's deadline closes every connection while a cancelled
// admission still waits for its Resume.
func TestCancelOncePerBegin(t *testing.T) {
	up := httpUpstream(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	hook := &holdHook{testHook: newTestHook(nil), begun: make(chan struct{}, 1)}
	p, addr := startProxy(t, hook.testHook, &exchange.Service{Upstream: up}, func(cfg *Config) {
		cfg.Hook = hook
		cfg.EventLoops = 1
	})
	c := dialClient(t, addr)
	c.send("GET /held HTTP/1.1\r\nHost: x\r\n\r\n")
	<-hook.begun
	c.c.Close() // the client goes away during admission: Cancel
	testkit.WaitFor(t, "Cancel", func() bool { return hook.cancels.Load() >= 1 })
	forced := make(chan struct{})
	p.lg.testAfterForce = func() { close(forced) }
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	shut := make(chan error, 1)
	go func() { shut <- p.Shutdown(ctx) }()
	<-forced // the deadline passed and every connection was closed (abort)
	hook.mu.Lock()
	for _, pd := range hook.pending {
		*pd.d = exchange.Decision{Allow: false, Status: 503}
		pd.res.Resume()
	}
	hook.mu.Unlock()
	if err := <-shut; err != context.DeadlineExceeded {
		t.Fatalf("Shutdown: %v, want the deadline's error", err)
	}
	if n := hook.cancels.Load(); n != 1 {
		t.Fatalf("Cancel called %d times for one Begin", n)
	}
}
