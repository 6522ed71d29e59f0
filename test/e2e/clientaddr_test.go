package e2e

import (
	"os/exec"
	"strconv"
	"strings"
	"testing"

	"github.com/rl-tproxy/rl-tproxy/internal/testkit"
)

// Behind a balancer: a zone keyed on {remote_addr} with burst 2, and
// client_address trusting X-Forwarded-For from 127.0.0.1 only. The
// client the header names is limited, not the balancer; a spoofed left
// part of the list does not move the key; a peer outside trusted is
// keyed by its own address whatever it sends. HTTP/1.1 and HTTP/2 alike.
func TestClientAddressBehindBalancer(t *testing.T) {
	e := newEnv(t, nil, policyOpts{
		defaults: "defaults:\n  client_address: {from: x-forwarded-for, trusted: [127.0.0.1/32]}\n  upstream_protocol: http1\n",
		zones:    "  per_client: {bucket: \"c:{remote_addr}\", rate: 1/m, burst: 2}\n",
		extra:    "      - name: realip\n        match: {path_prefix: /realip}\n        limit: [per_client]\n",
	})
	testkit.NeedTool(t, "curl", "curl")
	step := func(name string, want int, args ...string) {
		t.Helper()
		// The status alone (curl -w): curl writes HTTP/2 heads as
		// "HTTP/2 200", which net/http's response reader refuses.
		full := append([]string{"-s", "-S", "--max-time", "10", "-o", "/dev/null", "-w", "%{http_code}"}, args...)
		out, err := exec.Command("curl", append(full, e.p.base+"/realip")...).Output()
		if err != nil {
			t.Fatalf("%s: curl: %v", name, err)
		}
		if got, _ := strconv.Atoi(strings.TrimSpace(string(out))); got != want {
			t.Fatalf("%s: status %s, want %d", name, out, want)
		}
	}
	step("first from .7", 200, "-H", "X-Forwarded-For: 203.0.113.7")
	step("second from .7", 200, "-H", "X-Forwarded-For: 203.0.113.7")
	step("third from .7", 429, "-H", "X-Forwarded-For: 203.0.113.7")
	step("spoofed left part, still .7", 429, "-H", "X-Forwarded-For: 198.51.100.9, 203.0.113.7")
	step("another client", 200, "-H", "X-Forwarded-For: 203.0.113.8")
	l := e.p.waitAccess(5)
	if l["remote"] != "203.0.113.8:0" {
		t.Errorf("access line remote %v, want the forwarded client 203.0.113.8:0", l["remote"])
	}
	if peer, _ := l["peer"].(string); len(peer) < len("127.0.0.1:") || peer[:len("127.0.0.1:")] != "127.0.0.1:" {
		t.Errorf("access line peer %v, want the balancer 127.0.0.1:port", l["peer"])
	}

	// HTTP/2 (prior knowledge, the same port): the same resolution.
	h2 := []string{"--http2-prior-knowledge", "-H", "X-Forwarded-For: 203.0.113.9"}
	step("h2 first from .9", 200, h2...)
	step("h2 second from .9", 200, h2...)
	step("h2 third from .9", 429, h2...)
	if l := e.p.waitAccess(8); l["proto"] != "h2" || l["remote"] != "203.0.113.9:0" {
		t.Errorf("HTTP/2 deny's line: proto %v remote %v, want h2 and 203.0.113.9:0", l["proto"], l["remote"])
	}

	// A peer outside trusted (127.0.0.2): its header is not believed, so
	// it is keyed by its own address, however many clients it claims.
	for i, xff := range []string{"203.0.113.20", "203.0.113.21", "203.0.113.22"} {
		want := 200
		if i == 2 {
			want = 429
		}
		step("untrusted peer, claims "+xff, want, "--interface", "127.0.0.2", "-H", "X-Forwarded-For: "+xff)
	}
	l = e.p.waitAccess(11)
	if l["remote"] == nil || l["remote"].(string)[:len("127.0.0.2:")] != "127.0.0.2:" || l["remote"] != l["peer"] {
		t.Errorf("untrusted peer's line: remote %v peer %v, want both its own address", l["remote"], l["peer"])
	}
}
