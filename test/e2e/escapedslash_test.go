package e2e

import (
	"os/exec"
	"strconv"
	"strings"
	"testing"

	"github.com/rl-tproxy/rl-tproxy/internal/testkit"
)

// curlStatus runs the real curl and returns the response status (any
// protocol curl speaks, HTTP/2 included).
func curlStatus(t *testing.T, args ...string) int {
	t.Helper()
	testkit.NeedTool(t, "curl", "curl")
	full := append([]string{"-s", "-S", "--max-time", "10", "-o", "/dev/null", "-w", "%{http_code}"}, args...)
	out, err := exec.Command("curl", full...).Output()
	if err != nil {
		t.Fatalf("curl %v: %v", args, err)
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(out)))
	if err != nil {
		t.Fatalf("curl %v: status %q: %v", args, out, err)
	}
	return n
}

// escapedSlashLocations puts an unprotected catch-all before the limited
// "api" one and a limited /lim/ location before it: a request for /lim/x
// is limited, one for anything else outside /lim/ is open.
const escapedSlashLocations = `      - name: lim
        match: {path_prefix: /lim/}
        limit: [strict]
      - name: open
        match: {path_prefix: /}
`

// A path with an escaped slash or backslash is refused by default, over
// HTTP/1.1 and HTTP/2 alike, before admission and before the upstream:
// matching the raw path would admit /lim%2fx as location "open" while a
// Go upstream serves it as /lim/x.
func TestEscapedSlashRefused(t *testing.T) {
	e := newEnv(t, nil, policyOpts{extra: escapedSlashLocations, service: "    upstream_protocol: http1\n"})
	for _, proto := range [][]string{{"--http1.1"}, {"--http2-prior-knowledge"}} {
		for _, path := range []string{"/lim%2fx", "/lim%2Fx", "/lim%5cx"} {
			if st := curlStatus(t, append(proto, "--path-as-is", "-H", "X-Key: k", e.p.base+path)...); st != 400 {
				t.Errorf("%s %s: status %d, want 400", proto[0], path, st)
			}
		}
		if st := curlStatus(t, append(proto, "-H", "X-Key: k", e.p.base+"/other")...); st != 200 {
			t.Errorf("%s /other: status %d, want 200", proto[0], st)
		}
	}
	if n := e.up.hits.Load(); n != 2 {
		t.Errorf("upstream saw %d requests, want 2 (only /other)", n)
	}
	if got := e.p.metric(`rl_tproxy_rejections_total{reason="escaped-slash",status="400"}`); got != 6 {
		t.Errorf("escaped-slash rejections %v, want 6", got)
	}
}

// With escaped_slashes: decode, /lim%2fx is matched as /lim/x, the path
// the upstream serves, and shares its limit: the burst of 3 spent on
// /lim/x leaves none for /lim%2fx, over HTTP/1.1 or HTTP/2.
func TestEscapedSlashDecodedLimited(t *testing.T) {
	for _, proto := range []string{"--http1.1", "--http2-prior-knowledge"} {
		t.Run(proto, func(t *testing.T) {
			e := newEnv(t, nil, policyOpts{extra: escapedSlashLocations, service: "    escaped_slashes: decode\n    upstream_protocol: http1\n"})
			for i := 0; i < 3; i++ {
				if st := curlStatus(t, proto, "-H", "X-Key: k", e.p.base+"/lim/x"); st != 200 {
					t.Fatalf("/lim/x #%d: %d", i, st)
				}
			}
			if st := curlStatus(t, proto, "--path-as-is", "-H", "X-Key: k", e.p.base+"/lim%2fx"); st != 429 {
				t.Fatalf("/lim%%2fx after the burst: %d, want 429 (limited like /lim/x)", st)
			}
			if st := curlStatus(t, proto, "--path-as-is", "-H", "X-Key: k", e.p.base+"/lim%2f..%2fx"); st != 400 {
				t.Fatalf("/lim%%2f..%%2fx: %d, want 400 (a dot segment across a decoded slash)", st)
			}
			if st := curlStatus(t, proto, "-H", "X-Key: k", e.p.base+"/other"); st != 200 {
				t.Fatalf("/other: %d", st)
			}
		})
	}
}
