package proxy

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/rl-tproxy/rl-tproxy/pkg/exchange"
)

// Service.AdmissionTimeout (the policy's timeouts.admission) is the
// admission bound of the service's requests: a Hook that never answers
// gets its client a 503 at the service's bound, not at the Config's
// (an hour here: a request answered within the test bound was answered
// at the service's), and an Update that changes it applies to the next
// request.
func TestServiceAdmissionTimeout(t *testing.T) {
	const short = 50 * time.Millisecond
	cases := []struct {
		name string
		// initial is the service's bound at start; Update sets short
		// before the request when it differs.
		initial time.Duration
		hook    func() (exchange.Hook, *testHook)
	}{
		{"blocking", short, func() (exchange.Hook, *testHook) {
			th := newTestHook(func(ctx context.Context, _ *exchange.Request) exchange.Decision {
				<-ctx.Done() // never answers before the deadline
				return exchange.Decision{Allow: true}
			})
			return th, th
		}},
		{"async", short, func() (exchange.Hook, *testHook) {
			h := newAsyncTestHook() // answers from Cancel only
			return h, h.testHook
		}},
		{"updated-live", time.Hour, func() (exchange.Hook, *testHook) {
			th := newTestHook(func(ctx context.Context, _ *exchange.Request) exchange.Decision {
				<-ctx.Done()
				return exchange.Decision{Allow: true}
			})
			return th, th
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			up := newRawUpstream(t, func(int, net.Conn) {})
			hook, th := tc.hook()
			svc := &exchange.Service{Upstream: up.addr(), AdmissionTimeout: tc.initial}
			p, addr := startProxy(t, th, svc, func(cfg *Config) {
				cfg.Hook = hook
				cfg.AdmissionTimeout = time.Hour
			})
			if tc.initial != short {
				cfg := *p.Config()
				ns := *svc
				ns.AdmissionTimeout = short
				cfg.Services = []*exchange.Service{&ns}
				if err := p.Update(cfg); err != nil {
					t.Fatal(err)
				}
			}
			c := dialClient(t, addr) // reads are bounded
			c.send("GET /slow HTTP/1.1\r\nHost: x\r\n\r\n")
			r, body := c.resp("GET")
			if r.StatusCode != 503 || !r.Close || body != "503 Service Unavailable\n" {
				t.Fatalf("answer %d %q (close %v), want 503 with Connection: close", r.StatusCode, body, r.Close)
			}
			c.expectClosed()
			d := th.waitDone(t)
			if d.status != 503 || d.clientAborted || !isTimeout(d.admissionErr) ||
				!strings.Contains(d.admissionErr.Error(), "within "+short.String()) {
				t.Fatalf("done %+v, want 503 with an AdmissionErr naming %v", d, short)
			}
			if up.count() != 0 {
				t.Fatal("a request whose admission timed out reached the upstream")
			}
		})
	}
}

// A negative service admission timeout is a configuration error (zero
// means the Config's).
func TestServiceAdmissionTimeoutValidated(t *testing.T) {
	for _, tc := range []struct {
		d  time.Duration
		ok bool
	}{{0, true}, {time.Millisecond, true}, {-time.Second, false}} {
		_, err := New(Config{Config: exchange.Config{Services: []*exchange.Service{{Name: "web", Upstream: "127.0.0.1:1", AdmissionTimeout: tc.d}}}})
		if (err == nil) != tc.ok {
			t.Errorf("AdmissionTimeout %v: New error %v, want ok %v", tc.d, err, tc.ok)
		}
		if err != nil && !strings.Contains(err.Error(), `service "web": negative admission timeout`) {
			t.Errorf("AdmissionTimeout %v: error %q does not say why", tc.d, err)
		}
	}
}
