package hook

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rl-tproxy/rl-tproxy/internal/testkit"
	"github.com/rl-tproxy/rl-tproxy/pkg/admission"
	"github.com/rl-tproxy/rl-tproxy/pkg/exchange"
	"github.com/rl-tproxy/rl-tproxy/pkg/proxy"
)

const invalidPolicyYAML = `ratelimitly:
  embedded: true
  fail: open
%s
zones:
  tk: {bucket: "tk:{header.x-key}", rate: 1/m}
  bare: {bucket: "{header.x-key}", rate: 1/m}
services:
  - name: web
    listen: 127.0.0.1:1
    upstream: %s
    locations:
      - name: bare
        match: {path_prefix: /bare}
        limit: [bare]
      - name: api
        match: {path_prefix: /}
        limit: [tk]
`

// newInvalidRig serves invalidPolicyYAML (with extra lines in the
// ratelimitly block) through the proxy, every check allowed.
func newInvalidRig(t *testing.T, extra string) *rig {
	t.Helper()
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprintln(w, "ok") }))
	t.Cleanup(up.Close)
	path := filepath.Join(t.TempDir(), "policy.yaml")
	if err := os.WriteFile(path, []byte(fmt.Sprintf(invalidPolicyYAML, extra, up.Listener.Addr())), 0o644); err != nil {
		t.Fatal(err)
	}
	pol, err := admission.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	r := &rig{ck: &fakeChecker{fn: allowAll}, logs: &testkit.SyncBuffer{}, up: up}
	r.g = New(Config{AccessLog: slog.New(slog.NewJSONHandler(r.logs, nil))})
	r.g.Swap(pol)
	r.g.SetChecker(r.ck, nil)
	svcs := ProxyServices(pol)
	p, err := proxy.New(proxy.Config{Config: exchange.Config{Services: svcs, Hook: hookFor(r.g)}})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := proxy.Listen(context.Background(), "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = p.Serve(ln, svcs[0]) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = p.Shutdown(ctx)
	})
	r.base = "http://" + ln.Addr().String()
	return r
}

// Under fail: open, an oversized or missing key is a 429 with invalid:
// deny and an admitted fail_open without it (the contract's default).
func TestInvalidDenyThroughProxy(t *testing.T) {
	long := strings.Repeat("k", 1100)
	cases := []struct{ path, key string }{{"/api", long}, {"/bare", ""}, {"/bare", long}}
	for _, knob := range []string{"", "  invalid: deny"} {
		r := newInvalidRig(t, knob)
		for i, c := range cases {
			resp := r.get(t, c.path, c.key)
			l := r.accessLines(t, i+1)[i]
			want, outcome := 200, "fail_open"
			if knob != "" {
				want, outcome = 429, "deny"
			}
			if resp.StatusCode != want || l["outcome"] != outcome || l["cause"] != "invalid_value" {
				t.Fatalf("%q %s key %d bytes: status %d, access line %v; want %d %s", knob, c.path, len(c.key), resp.StatusCode, l, want, outcome)
			}
			if knob != "" && resp.Header.Get("Retry-After") == "" {
				t.Fatalf("a deny without Retry-After")
			}
		}
		if n := r.ck.checks.Load(); n != 0 {
			t.Fatalf("%d invalid values were sent to RateLimitly", n)
		}
	}
}

// A running proxy logs the policy's warnings (what check prints) when the
// policy is installed, at start and on every reload.
func TestSwapLogsPolicyWarnings(t *testing.T) {
	path := filepath.Join(t.TempDir(), "policy.yaml")
	if err := os.WriteFile(path, []byte(fmt.Sprintf(invalidPolicyYAML, "", "127.0.0.1:9")), 0o644); err != nil {
		t.Fatal(err)
	}
	pol, err := admission.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	logs := &testkit.SyncBuffer{}
	g := New(Config{Logger: slog.New(slog.NewTextHandler(logs, nil))})
	g.Swap(pol)
	if n := strings.Count(logs.String(), "policy warning"); n != 2 || !strings.Contains(logs.String(), "zones.tk.bucket renders {header.x-key}") {
		t.Fatalf("%d warnings logged, want 2 (one per zone):\n%s", n, logs.String())
	}
}
