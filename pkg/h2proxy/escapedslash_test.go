package h2proxy_test

import (
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"sync"
	"testing"

	"github.com/rl-tproxy/rl-tproxy/pkg/exchange"
)

// An HTTP/2 :path with an escaped slash gets the HTTP/1.1 rule
// (exchange.CheckPath): refused with 400 before admission by default,
// admitted (to be matched decoded) when the service decodes them.
func TestEscapedSlashPath(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Write([]byte("upstream " + r.URL.EscapedPath()))
	}))
	t.Cleanup(up.Close)
	for _, tc := range []struct {
		name   string
		decode bool
		path   string
		status int
		rule   string
	}{
		{"refused", false, "/api%2fx", 400, exchange.RuleEscapedSlash},
		{"refused-backslash", false, "/api%5Cx", 400, exchange.RuleEscapedSlash},
		{"plain", false, "/api/x", 200, ""},
		{"decoded", true, "/api%2fx", 200, ""},
		{"decoded-dots", true, "/api%2f..%2fx", 400, exchange.RuleEscapedSlashDotSegment},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var mu sync.Mutex
			var rules []string
			svc := &exchange.Service{Name: "web", Upstream: strings.TrimPrefix(up.URL, "http://"), DecodeEscapedSlashes: tc.decode, UpstreamProtocol: "http1"}
			cfg := &exchange.Config{Services: []*exchange.Service{svc}, Hook: &rec{},
				OnReject: func(_ *exchange.Service, _ netip.AddrPort, rule string, _ int) {
					mu.Lock()
					rules = append(rules, rule)
					mu.Unlock()
				}}
			h := cfg.Hook.(*rec)
			_, addr := serveConns(t, func() (*exchange.Service, *exchange.Config) { return svc, cfg })
			cl := h2cClient()
			defer cl.CloseIdleConnections()
			resp, err := cl.Get("http://" + addr + tc.path)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != tc.status || resp.ProtoMajor != 2 {
				t.Fatalf("%s: %s %d, want HTTP/2 %d", tc.path, resp.Proto, resp.StatusCode, tc.status)
			}
			if admitted := h.admittedPath(tc.path); admitted != (tc.status == 200) {
				t.Errorf("%s reached admission: %v", tc.path, admitted)
			}
			mu.Lock()
			defer mu.Unlock()
			if tc.rule != "" && (len(rules) != 1 || rules[0] != tc.rule) {
				t.Errorf("rejections %q, want %q", rules, tc.rule)
			}
		})
	}
}
