package hook

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/rl-tproxy/rl-tproxy/pkg/admission"
	"github.com/rl-tproxy/rl-tproxy/pkg/ratelimitly/wire"
)

// allPolicy is testPolicyYAML with ratelimit_headers: all on its service.
func allPolicy(t testing.TB, fail, upstream string) *admission.Policy {
	t.Helper()
	body := strings.Replace(testPolicyYAML, "    upstream: %s\n", "    upstream: %s\n    ratelimit_headers: all\n", 1)
	path := filepath.Join(t.TempDir(), "policy.yaml")
	if err := os.WriteFile(path, []byte(fmt.Sprintf(body, fail, upstream)), 0o644); err != nil {
		t.Fatal(err)
	}
	p, err := admission.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// allowOneLeft answers allow with 1 token left in each zone (per_key:
// burst 2 at 10/s, so full again in 100ms: t=1).
func allowOneLeft(ctx context.Context, req *wire.RateRequest, out *admission.CheckResult) {
	allowAll(ctx, req, out)
	for i := range out.Resp.Resources {
		out.Resp.Resources[i].Remaining = 1
	}
}

// An allowed response of a ratelimit_headers: all service carries the
// RateLimit fields of its decision after the upstream's own (which pass
// unchanged); unprotected locations and other services' allows carry
// none, and a deny keeps its answer.
func TestAllowRateLimitFieldsThroughProxy(t *testing.T) {
	var deny atomic.Bool
	r := newRig(t, "close", func(ctx context.Context, req *wire.RateRequest, out *admission.CheckResult) {
		if deny.Load() {
			denyResource(ctx, req, out)
			return
		}
		allowOneLeft(ctx, req, out)
	})
	get := func(path string) *http.Response {
		t.Helper()
		resp := r.get(t, path, "alice")
		if resp.StatusCode != 200 {
			t.Fatalf("%s: status %d", path, resp.StatusCode)
		}
		return resp
	}
	// ratelimit_headers absent: the upstream's fields only.
	if got := get("/api/x").Header.Values("RateLimit"); len(got) != 1 {
		t.Fatalf("default policy: RateLimit %q, want the upstream's alone", got)
	}
	r.g.Swap(allPolicy(t, "close", r.up.Listener.Addr().String()))
	resp := get("/api/x")
	if got, want := resp.Header.Values("RateLimit"), []string{`"upstream";r=1;t=9`, `"per_key";r=1;t=1`}; !slices.Equal(got, want) {
		t.Errorf("RateLimit %q, want %q", got, want)
	}
	if got, want := resp.Header.Values("RateLimit-Policy"), []string{`"upstream";q=5;w=60`, `"per_key";q=10;w=1`}; !slices.Equal(got, want) {
		t.Errorf("RateLimit-Policy %q, want %q", got, want)
	}
	// Unprotected and shadow locations: nothing added.
	for _, path := range []string{"/open/x", "/shadow/x"} {
		if got := get(path).Header.Values("RateLimit-Policy"); len(got) != 1 {
			t.Errorf("%s: RateLimit-Policy %q, want the upstream's alone", path, got)
		}
	}
	// A deny is still the deny answer.
	deny.Store(true)
	d := r.get(t, "/api/x", "alice")
	if d.StatusCode != 429 || d.Header.Get("RateLimit") != `"per_key";r=0;t=3` || d.Header.Get("Retry-After") != "3" {
		t.Fatalf("deny: %d RateLimit %q Retry-After %q", d.StatusCode, d.Header.Get("RateLimit"), d.Header.Get("Retry-After"))
	}
}
