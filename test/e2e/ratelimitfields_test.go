package e2e

import (
	"context"
	"net"
	"net/http"
	"slices"
	"testing"
	"time"
)

// With ratelimit_headers: all, an allowed response carries the
// RateLimit-Policy and RateLimit fields of its own admission (the
// cluster's answer: tokens left, seconds until the bucket is full again),
// after the upstream's own RateLimit field, over HTTP/1.1 and HTTP/2.
// Zone strict: 5/m, burst 3, so each request leaves one token fewer and
// each missing token takes 12s to come back.
func TestRateLimitFieldsOnAllow(t *testing.T) {
	e := newEnv(t, nil, policyOpts{service: "    ratelimit_headers: all\n    upstream_protocol: http1\n"})
	const policy = `"strict";q=5;w=60`
	check := func(name string, h http.Header, fields string) {
		t.Helper()
		if got := h.Values("RateLimit-Policy"); !slices.Equal(got, []string{policy}) {
			t.Errorf("%s: RateLimit-Policy %q, want %q", name, got, policy)
		}
		if got, want := h.Values("RateLimit"), []string{`"upstream";r=1;t=9`, fields}; !slices.Equal(got, want) {
			t.Errorf("%s: RateLimit %q, want %q", name, got, want)
		}
	}

	// HTTP/1.1 (curl).
	for i, want := range []string{`"strict";r=2;t=12`, `"strict";r=1;t=24`} {
		r := e.get(t, "/fields", "X-Key: h1")
		if r.status != 200 {
			t.Fatalf("HTTP/1.1 request %d: status %d", i, r.status)
		}
		check("HTTP/1.1", r.header, want)
	}
	// A deny is still the deny answer, with the fields of its zone.
	e.get(t, "/fields", "X-Key: h1")
	d := e.get(t, "/fields", "X-Key: h1")
	if d.status != 429 || d.header.Get("RateLimit-Policy") != policy || d.header.Get("Retry-After") == "" {
		t.Fatalf("deny: status %d fields %v", d.status, d.header)
	}

	// HTTP/2 prior knowledge (Go's client), the same port.
	tr := &http.Transport{DialContext: (&net.Dialer{Timeout: 10 * time.Second}).DialContext}
	tr.Protocols = new(http.Protocols)
	tr.Protocols.SetUnencryptedHTTP2(true)
	defer tr.CloseIdleConnections()
	hc := &http.Client{Transport: tr, Timeout: 20 * time.Second}
	for i, want := range []string{`"strict";r=2;t=12`, `"strict";r=1;t=24`} {
		req, _ := http.NewRequestWithContext(context.Background(), "GET", e.p.base+"/fields", nil)
		req.Header.Set("X-Key", "h2")
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatalf("HTTP/2 request %d: %v", i, err)
		}
		resp.Body.Close()
		if resp.StatusCode != 200 || resp.ProtoMajor != 2 {
			t.Fatalf("HTTP/2 request %d: %s %d", i, resp.Proto, resp.StatusCode)
		}
		check("HTTP/2", resp.Header, want)
	}

	// An unprotected location's allow carries the upstream's field only.
	if r := e.get(t, "/probe"); r.status != 200 || len(r.header.Values("RateLimit")) != 1 || r.header.Get("RateLimit-Policy") != "" {
		t.Fatalf("unprotected: status %d fields %v", r.status, r.header)
	}
}
