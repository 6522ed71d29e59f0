package hook

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/rl-tproxy/rl-tproxy/internal/testkit"
	"github.com/rl-tproxy/rl-tproxy/pkg/accesslog"
	"github.com/rl-tproxy/rl-tproxy/pkg/admission"
	"github.com/rl-tproxy/rl-tproxy/pkg/exchange"
	"github.com/rl-tproxy/rl-tproxy/pkg/httpparse"
	"github.com/rl-tproxy/rl-tproxy/pkg/ratelimitly"
	"github.com/rl-tproxy/rl-tproxy/pkg/ratelimitly/wire"
)

var generatedID = regexp.MustCompile(`^[0-9a-f]{32}$`)

// echoIDs is an upstream that answers with the request id and traceparent
// fields it received (each value list joined by "|").
func echoIDs(w http.ResponseWriter, r *http.Request) {
	fmt.Fprintf(w, "%s\n%s\n", strings.Join(r.Header.Values("X-Request-ID"), "|"), strings.Join(r.Header.Values("Traceparent"), "|"))
}

func (r *rig) do(t *testing.T, path string, hdr map[string]string) (*http.Response, string) {
	t.Helper()
	req, _ := http.NewRequest("GET", r.base+path, nil)
	req.Header.Set("X-Key", "alice")
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp, string(b)
}

const testTraceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"

// An allowed request: the client's valid id and traceparent reach the
// upstream untouched; the line has them, the upstream, its status and
// time to the response head, and the protocol.
func TestAccessLineAllowed(t *testing.T) {
	r := newRigUpstream(t, "close", allowAll, http.HandlerFunc(echoIDs))
	resp, body := r.do(t, "/api/x?q=1", map[string]string{"X-Request-ID": "abc-123", "Traceparent": testTraceparent,
		"User-Agent": "probe/1", "Referer": "http://ref/"})
	if resp.StatusCode != 200 || body != "abc-123\n"+testTraceparent+"\n" {
		t.Fatalf("answer %d %q", resp.StatusCode, body)
	}
	l := r.accessLines(t, 1)[0]
	want := map[string]any{"request_id": "abc-123", "traceparent": testTraceparent, "proto": "http/1.1",
		"upstream": r.up.Listener.Addr().String(), "upstream_status": float64(200), "query": "q=1",
		"user_agent": "probe/1", "referer": "http://ref/"}
	for k, v := range want {
		if l[k] != v {
			t.Errorf("%s = %v, want %v", k, l[k], v)
		}
	}
	if ttfb, ok := l["upstream_ttfb_ms"].(float64); !ok || ttfb <= 0 {
		t.Errorf("upstream_ttfb_ms %v", l["upstream_ttfb_ms"])
	}
	for _, k := range []string{"deny_zones", "deny_guards", "retry_after"} {
		if _, ok := l[k]; ok {
			t.Errorf("allowed request's line has %s: %v", k, l)
		}
	}
}

// A missing, invalid or repeated id is replaced by a generated one that
// the upstream sees exactly once and the line names.
func TestRequestIDGeneratedUpstream(t *testing.T) {
	for _, c := range []struct {
		name string
		raw  string // extra request fields
	}{
		{"missing", ""},
		{"space", "X-Request-ID: two words\r\n"},
		{"quote", "X-Request-ID: a\"b\r\n"},
		{"too long", "X-Request-ID: " + strings.Repeat("a", MaxRequestIDLen+1) + "\r\n"},
		{"repeated", "X-Request-ID: a\r\nx-request-id: b\r\n"},
		{"hop-by-hop", "X-Request-ID: a\r\nConnection: keep-alive, x-request-id\r\n"},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := newRigUpstream(t, "close", allowAll, http.HandlerFunc(echoIDs))
			resp := rawGet(t, r.base, "GET /api/x HTTP/1.1\r\nHost: h\r\nX-Key: alice\r\n"+c.raw+"Connection: close\r\n\r\n")
			got := strings.SplitN(resp, "\n", 2)[0]
			if !generatedID.MatchString(got) {
				t.Fatalf("upstream saw request id %q, want one generated id", got)
			}
			if l := r.accessLines(t, 1)[0]; l["request_id"] != got {
				t.Fatalf("line request_id %v, upstream saw %q", l["request_id"], got)
			}
		})
	}
}

// A deny names the short zone and the Retry-After sent, and carries the
// same generated id in the answer and the line; a failed guard is named.
func TestAccessLineDenied(t *testing.T) {
	r := newRig(t, "close", denyResource)
	resp, _ := r.do(t, "/api/x", nil)
	if resp.StatusCode != 429 || resp.Header.Get("Retry-After") != "3" {
		t.Fatalf("answer %d, Retry-After %q", resp.StatusCode, resp.Header.Get("Retry-After"))
	}
	id := resp.Header.Get("X-Request-ID")
	if !generatedID.MatchString(id) {
		t.Fatalf("deny answer X-Request-ID %q", id)
	}
	l := r.accessLines(t, 1)[0]
	if l["deny_zones"] != "per_key" || l["retry_after"] != float64(3) || l["request_id"] != id {
		t.Fatalf("access line %v", l)
	}
	if _, ok := l["upstream"]; ok {
		t.Fatalf("denied request's line names an upstream: %v", l)
	}
	if d := denials(t, r.g); d["zone/per_key"] != 1 || d["guard/api"] != 0 {
		t.Fatalf("rl_tproxy_denials_total %v, want zone per_key 1, guard api 0", d)
	}

	g := newRig(t, "close", func(ctx context.Context, req *wire.RateRequest, out *admission.CheckResult) {
		allowAll(ctx, req, out)
		out.Resp.Success = false
		out.Resp.Guards[0] = wire.GuardResult{Passed: false, ObservedMs: 900}
	})
	resp, body := g.do(t, "/api/x", map[string]string{"X-Request-ID": "client-7"})
	if resp.StatusCode != 429 || resp.Header.Get("X-Request-ID") != "client-7" {
		t.Fatalf("guard deny %d, X-Request-ID %q", resp.StatusCode, resp.Header.Get("X-Request-ID"))
	}
	// The answer says a guard shed the request: its body, Retry-After
	// deny.guard_retry_after (default 5s), and no RateLimit field (its
	// zone had quota left, which would contradict the deny).
	if resp.Header.Get("Retry-After") != "5" || resp.Header.Get("RateLimit") != "" || !strings.Contains(body, admission.GuardMessage) {
		t.Fatalf("guard deny answer: Retry-After %q RateLimit %q body %q", resp.Header.Get("Retry-After"), resp.Header.Get("RateLimit"), body)
	}
	if l := g.accessLines(t, 1)[0]; l["deny_guards"] != "api" || l["deny_zones"] != nil || l["retry_after"] != float64(5) {
		t.Fatalf("guard deny line %v", l)
	}
	if d := denials(t, g.g); d["zone/per_key"] != 0 || d["guard/api"] != 1 {
		t.Fatalf("rl_tproxy_denials_total %v, want zone per_key 0, guard api 1", d)
	}
}

// rawGet sends one raw request on a fresh connection and returns the body.
func rawGet(t *testing.T, base, raw string) string {
	t.Helper()
	c := dialRaw(t, strings.TrimPrefix(base, "http://"))
	if _, err := io.WriteString(c, raw); err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(c)
	if err != nil {
		t.Fatal(err)
	}
	_, body, ok := strings.Cut(string(b), "\r\n\r\n")
	if !ok || !strings.HasPrefix(string(b), "HTTP/1.1 200 ") {
		t.Fatalf("answer %q", b)
	}
	return body
}

// The policy's request_id block: another field name; generate: false
// passes a valid id through and adds none.
func TestRequestIDPolicy(t *testing.T) {
	for _, c := range []struct {
		name, block, reqField string
		field                 string // the id field; "" = no id anywhere
		clientID              string // the id passed through; "" = generated
	}{
		{"renamed, generated", "request_id: {header: X-Corr}\n", "X-Request-ID: ignored\r\n", "X-Corr", ""},
		{"renamed, passed", "request_id: {header: X-Corr}\n", "x-corr: c-1\r\n", "X-Corr", "c-1"},
		{"no generation, none sent", "request_id: {generate: false}\n", "", "", ""},
		{"no generation, passed", "request_id: {generate: false}\n", "X-Request-ID: c-1\r\n", "X-Request-ID", "c-1"},
	} {
		t.Run(c.name, func(t *testing.T) {
			p, err := admission.Parse("p.yaml", []byte(c.block+fmt.Sprintf(testPolicyYAML, "close", "127.0.0.1:9")))
			if err != nil {
				t.Fatal(err)
			}
			var head httpparse.Request
			if err := head.Parse([]byte("GET /api/x HTTP/1.1\r\nHost: h\r\nX-Key: k\r\n"+c.reqField+"\r\n"), httpparse.Limits{}); err != nil {
				t.Fatal(err)
			}
			r := &exchange.Request{Remote: netip.MustParseAddrPort("10.0.0.1:1"), Local: netip.MustParseAddrPort("127.0.0.1:1"),
				Head: &head, Path: []byte("/api/x"), Start: time.Now()}
			for _, fn := range []func(context.Context, *wire.RateRequest, *admission.CheckResult){allowAll, denyResource} {
				g := New(Config{})
				g.SetChecker(&countingChecker{fn: fn}, nil)
				g.Swap(p)
				d := admitVia(g, context.Background(), r)
				fields := d.Forward // on allow: added upstream only when generated
				if !d.Allow {
					fields = d.Header
				}
				var got []string
				for _, h := range fields {
					if strings.HasPrefix(strings.ToLower(string(h.Name)), "x-") {
						got = append(got, string(h.Name)+": "+string(h.Value))
					}
				}
				g.Done(r, &d, &exchange.Result{Status: 200, End: time.Now()})
				switch {
				case c.field == "" || d.Allow && c.clientID != "":
					if len(got) != 0 {
						t.Errorf("allow %v: fields %q, want none", d.Allow, got)
					}
				case len(got) != 1 || !strings.HasPrefix(got[0], c.field+": "):
					t.Errorf("allow %v: fields %q, want one %s", d.Allow, got, c.field)
				case c.clientID != "" && got[0] != c.field+": "+c.clientID:
					t.Errorf("allow %v: %q, want the client's %s", d.Allow, got[0], c.clientID)
				case c.clientID == "" && !generatedID.MatchString(strings.TrimPrefix(got[0], c.field+": ")):
					t.Errorf("allow %v: %q, want a generated id", d.Allow, got[0])
				}
			}
		})
	}
}

func dialRaw(t *testing.T, addr string) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	c.SetDeadline(time.Now().Add(10 * time.Second))
	t.Cleanup(func() { c.Close() })
	return c
}

// The gate's access line through the combined layout: the nginx columns
// come from the line's fields, the rest follows as key=value.
func TestAccessLineCombined(t *testing.T) {
	var buf testkit.SyncBuffer
	g := New(Config{AccessLog: slog.New(accesslog.NewCombined(&buf, nil))})
	g.SetChecker(&countingChecker{fn: denyResource}, nil)
	p, err := admission.Parse("p.yaml", []byte(fmt.Sprintf(testPolicyYAML, "close", "127.0.0.1:9")))
	if err != nil {
		t.Fatal(err)
	}
	g.Swap(p)
	var head httpparse.Request
	raw := "GET /api/x?a=1 HTTP/1.1\r\nHost: h\r\nX-Key: k\r\nUser-Agent: probe \"1\"\r\nX-Request-ID: r-1\r\n\r\n"
	if err := head.Parse([]byte(raw), httpparse.Limits{}); err != nil {
		t.Fatal(err)
	}
	r := &exchange.Request{Remote: netip.MustParseAddrPort("10.0.0.1:1234"), Local: netip.MustParseAddrPort("127.0.0.1:1"),
		Head: &head, Path: []byte("/api/x"), Query: []byte("a=1"), Start: time.Now(), Proto: exchange.ProtoHTTP11}
	d := admitVia(g, context.Background(), r)
	g.Done(r, &d, &exchange.Result{Status: 429, BytesOut: 262, End: time.Now()})
	re := regexp.MustCompile(`^10\.0\.0\.1 - - \[[^\]]+\] "GET /api/x\?a=1 HTTP/1\.1" 429 262 "-" "probe \\x221\\x22" service=web location=api .*deny_zones=per_key retry_after=3 .*request_id=r-1 `)
	if line := buf.String(); !re.MatchString(line) {
		t.Fatalf("combined line %q", line)
	}
}

// denials reads rl_tproxy_denials_total of location web/api as "kind/name".
func denials(t *testing.T, g *Gate) map[string]float64 {
	t.Helper()
	fams, err := g.Metrics().Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, f := range fams {
		if f.GetName() != "rl_tproxy_denials_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			l := map[string]string{}
			for _, p := range m.GetLabel() {
				l[p.GetName()] = p.GetValue()
			}
			if l["service"] == "web" && l["location"] == "api" {
				out[l["kind"]+"/"+l["name"]] = m.GetCounter().GetValue()
			}
		}
	}
	return out
}

// The deny answer tells a fail: close deny apart from a rate-limit deny
// (and from a guard's, TestAccessLineDenied): its own body, no RateLimit
// field, Retry-After 1.
func TestFailCloseAnswerSaysSo(t *testing.T) {
	for _, c := range []struct {
		name      string
		fn        func(context.Context, *wire.RateRequest, *admission.CheckResult)
		body      string
		rateLimit bool
	}{
		{"rate-limit", denyResource, "rate limit exceeded", true},
		{"fail-close", failWith(ratelimitly.CauseTimeout), admission.FailCloseMessage, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := newRig(t, "close", c.fn)
			resp, body := r.do(t, "/api/x", nil)
			if resp.StatusCode != 429 || !strings.Contains(body, c.body) || (resp.Header.Get("RateLimit") != "") != c.rateLimit {
				t.Fatalf("answer %d %q RateLimit %q, want body %q", resp.StatusCode, body, resp.Header.Get("RateLimit"), c.body)
			}
			if c.name == "fail-close" && (resp.Header.Get("Retry-After") != "1" || strings.Contains(body, "rate limit exceeded")) {
				t.Fatalf("fail-close answer Retry-After %q body %q", resp.Header.Get("Retry-After"), body)
			}
		})
	}
}
