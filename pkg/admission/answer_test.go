package admission

import (
	"encoding/json"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/rl-tproxy/rl-tproxy/pkg/httpparse"
)

func hdrMap(hs []httpparse.Header) map[string]string {
	m := map[string]string{}
	for _, h := range hs {
		m[string(h.Name)] = string(h.Value)
	}
	return m
}

func TestRetryAfterSeconds(t *testing.T) {
	for _, c := range []struct {
		ms   []uint32
		want uint32
	}{
		{nil, 1}, {[]uint32{0}, 1}, {[]uint32{1}, 1}, {[]uint32{999}, 1}, {[]uint32{1000}, 1},
		{[]uint32{1001}, 2}, {[]uint32{2500, 400}, 3}, {[]uint32{0, 3000}, 3}, {[]uint32{4294967295}, 4294968},
	} {
		var zs []ZoneState
		for _, m := range c.ms {
			zs = append(zs, ZoneState{RetryAfterMs: m, Known: true})
		}
		if got := RetryAfterSeconds(zs); got != c.want {
			t.Errorf("%v: %d, want %d", c.ms, got, c.want)
		}
	}
}

func TestDenyAnswerFields(t *testing.T) {
	a := NewDenyAnswer(AnswerSpec{RateLimitHeaders: true, JSON: true, Zones: []AnswerZone{
		{Name: "per_client", Quota: 100, Window: time.Second},
		{Name: `we"ird`, Quota: 10, Window: time.Minute},
	}})
	if a.Status != 429 || a.ContentType != "application/json" {
		t.Fatalf("status %d ct %q", a.Status, a.ContentType)
	}
	var body map[string]any
	if err := json.Unmarshal(a.Body, &body); err != nil || body["status"] != float64(429) {
		t.Fatalf("body %q: %v", a.Body, err)
	}
	hs, _ := a.Render(nil, nil, []ZoneState{{Remaining: 0, RetryAfterMs: 2100, Known: true}, {Remaining: 7, Known: true}})
	m := hdrMap(hs)
	if m["Retry-After"] != "3" {
		t.Errorf("Retry-After %q", m["Retry-After"])
	}
	if want := `"per_client";q=100;w=1, "we\"ird";q=10;w=60`; m["RateLimit-Policy"] != want {
		t.Errorf("RateLimit-Policy %q, want %q", m["RateLimit-Policy"], want)
	}
	if want := `"per_client";r=0;t=3, "we\"ird";r=7;t=0`; m["RateLimit"] != want {
		t.Errorf("RateLimit %q, want %q", m["RateLimit"], want)
	}
	// Fail-close: no decision data, only Retry-After 1 and the policy.
	hs, _ = a.Render(nil, nil, []ZoneState{{}, {}})
	m = hdrMap(hs)
	if m["Retry-After"] != "1" || m["RateLimit"] != "" || m["RateLimit-Policy"] == "" {
		t.Errorf("fail-close headers %v", m)
	}
}

func TestDenyAnswerHeadersOffAndText(t *testing.T) {
	a := NewDenyAnswer(AnswerSpec{Status: 503, Zones: []AnswerZone{{Name: "z", Quota: 1, Window: time.Hour}}})
	hs, _ := a.Render(nil, nil, []ZoneState{{RetryAfterMs: 10, Known: true}})
	if len(hs) != 1 || string(hs[0].Name) != "Retry-After" || string(hs[0].Value) != "1" {
		t.Fatalf("headers %v", hdrMap(hs))
	}
	if a.ContentType != "text/plain; charset=utf-8" || !strings.HasPrefix(string(a.Body), "503 Service Unavailable") {
		t.Fatalf("text body %q %q", a.ContentType, a.Body)
	}
	if a.PolicyField() != "" {
		t.Fatal("policy field with headers off")
	}
}

func BenchmarkDenyAnswerRender(b *testing.B) {
	a := NewDenyAnswer(AnswerSpec{RateLimitHeaders: true, Zones: []AnswerZone{{Name: "per_client", Quota: 100, Window: time.Second}}})
	hs := make([]httpparse.Header, 0, 3)
	buf := make([]byte, 0, AnswerBufSize)
	zs := []ZoneState{{Remaining: 0, RetryAfterMs: 1500, Known: true}}
	b.ReportAllocs()
	for b.Loop() {
		hs, buf = a.Render(hs[:0], buf[:0], zs)
	}
}

// The policy's switches reach the answer: per-service RateLimit headers
// off, per-location status and text body.
func TestLocationAnswerFromPolicy(t *testing.T) {
	dir := t.TempDir()
	path := dir + "/policy.yaml"
	body := `ratelimitly:
  embedded: true
zones:
  z: {bucket: "all", rate: 10/m, burst: 2}
services:
  - name: quiet
    listen: 127.0.0.1:18080
    upstream: 127.0.0.1:18081
    ratelimit_headers: false
    locations:
      - name: a
        limit: [z]
        deny: {status: 503, format: text}
  - name: loud
    listen: 127.0.0.1:18082
    upstream: 127.0.0.1:18081
    locations:
      - name: b
        limit: [z]
`
	if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	p, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	zs := []ZoneState{{Remaining: 0, RetryAfterMs: 6000, Known: true}}
	q := LocationAnswer(p.Services[0].Locations[0])
	hs, _ := q.Render(nil, nil, zs)
	if q.Status != 503 || q.ContentType != "text/plain; charset=utf-8" || len(hs) != 1 || string(hs[0].Value) != "6" {
		t.Fatalf("quiet: status %d ct %q headers %v", q.Status, q.ContentType, hdrMap(hs))
	}
	l := LocationAnswer(p.Services[1].Locations[0])
	m := hdrMap(func() []httpparse.Header { hs, _ := l.Render(nil, nil, zs); return hs }())
	if l.Status != 429 || l.ContentType != "application/json" || m["RateLimit-Policy"] != `"z";q=10;w=60` || m["RateLimit"] != `"z";r=0;t=6` {
		t.Fatalf("loud: status %d ct %q headers %v", l.Status, l.ContentType, m)
	}
}
