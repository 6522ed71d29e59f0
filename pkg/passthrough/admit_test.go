package passthrough

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rl-tproxy/rl-tproxy/pkg/exchange"
)

// stuckHook never decides in time: its Admit waits until its context
// ends or, with ignoreCtx, until release is closed whatever its context
// says. Its late Decision would allow.
type stuckHook struct {
	ignoreCtx bool
	release   chan struct{}
	unblock   sync.Once
	pending   atomic.Int32 // Admit calls not returned yet
	noDL      atomic.Int32 // Admit calls whose context had no deadline

	mu      sync.Mutex
	dones   []exchange.Result
	rejects []string
}

func (h *stuckHook) Admit(ctx context.Context, _ *exchange.Request) exchange.Decision {
	if _, ok := ctx.Deadline(); !ok {
		h.noDL.Add(1)
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

func (h *stuckHook) releaseAll() { h.unblock.Do(func() { close(h.release) }) }

func (h *stuckHook) results() ([]exchange.Result, []string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]exchange.Result(nil), h.dones...), append([]string(nil), h.rejects...)
}

// TestAdmissionTimeout: a TLS connection whose admission gives no
// decision within the service's admission timeout (a configured 50ms,
// no bound any assertion depends on) is reset without being relayed,
// while the Hook may still be blocked; it is reported as
// "admission-timeout" (status 0) and gets Done once, with AdmissionErr,
// when the Hook returns.
func TestAdmissionTimeout(t *testing.T) {
	for _, tc := range []struct {
		name      string
		ignoreCtx bool
	}{{"ctx", false}, {"ignores-ctx", true}} {
		t.Run(tc.name, func(t *testing.T) {
			up, pool := tlsUpstream(t, false)
			h := &stuckHook{ignoreCtx: tc.ignoreCtx, release: make(chan struct{})}
			addr, ev := start(t, h, &exchange.Service{Upstream: up, TLS: exchange.ModePassthrough, AdmissionTimeout: 50 * time.Millisecond})
			t.Cleanup(h.releaseAll) // before the proxy's Shutdown
			// The bound only a proxy that never answers meets.
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			d := tls.Dialer{Config: &tls.Config{ServerName: "a.example", RootCAs: pool}}
			if c, err := d.DialContext(ctx, "tcp", addr); err == nil {
				c.Close()
				t.Fatal("handshake completed")
			} else if ctx.Err() != nil {
				t.Fatalf("no answer: %v", err)
			}
			dones, rejects := h.results()
			if len(rejects) != 1 || rejects[0] != "admission-timeout 0" {
				t.Fatalf("rejections %q", rejects)
			}
			if tc.ignoreCtx {
				// Reset while the Hook is still in Admit: nothing ended yet.
				ev.mu.Lock()
				n := len(ev.evs)
				ev.mu.Unlock()
				if h.pending.Load() != 1 || len(dones) != 0 || n != 0 {
					t.Fatalf("reset with %d Admit calls pending, %d Done, %d events", h.pending.Load(), len(dones), n)
				}
				h.releaseAll()
			}
			e := ev.wait(t)
			if e.Action != AdmissionTimeout || !e.Admitted || !errors.Is(e.Err, exchange.ErrAdmissionTimeout) || string(e.SNI) != "a.example" || e.BytesOut != 0 {
				t.Fatalf("event %+v", e)
			}
			dones, _ = h.results()
			if len(dones) != 1 {
				t.Fatalf("Done %d times", len(dones))
			}
			if r := dones[0]; !errors.Is(r.AdmissionErr, exchange.ErrAdmissionTimeout) || r.ClientAborted || r.Status != 0 || r.BytesOut != 0 {
				t.Errorf("Result %+v, want an AdmissionErr that is exchange.ErrAdmissionTimeout", r)
			}
			if h.noDL.Load() != 0 {
				t.Error("Admit's context had no deadline")
			}
		})
	}
}
