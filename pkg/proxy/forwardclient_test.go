package proxy

import (
	"context"
	"net/http"
	"net/netip"
	"strings"
	"testing"

	"github.com/rl-tproxy/rl-tproxy/pkg/exchange"
)

// TestForwardingFieldsNameTheClient: the forwarding fields sent upstream
// name Request.Remote as it stands after admission: the client a Hook
// read from a trusted balancer's header (as hook.Gate does under
// client_address), else the TCP peer. X-Forwarded-For and Forwarded keep
// the balancer's list in front; X-Real-IP and X-Forwarded-Proto are
// replaced.
func TestForwardingFieldsNameTheClient(t *testing.T) {
	seen := make(chan http.Header, 4)
	up := httpUpstream(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seen <- r.Header.Clone()
	}))
	svc := &exchange.Service{Upstream: up, XForwardedFor: true, XForwardedProto: true, Forwarded: true, XRealIP: true}
	for _, tc := range []struct {
		name   string
		client string // what the Hook names; "" keeps the peer
		want   map[string]string
	}{
		{"named by the hook", "203.0.113.7", map[string]string{
			"X-Forwarded-For":   "203.0.113.7, 203.0.113.7",
			"Forwarded":         "for=203.0.113.7, for=203.0.113.7;proto=http",
			"X-Real-Ip":         "203.0.113.7",
			"X-Forwarded-Proto": "http",
		}},
		{"ipv6 named by the hook", "2001:db8::7", map[string]string{
			"X-Forwarded-For": "203.0.113.7, 2001:db8::7",
			"Forwarded":       `for=203.0.113.7, for="[2001:db8::7]";proto=http`,
			"X-Real-Ip":       "2001:db8::7",
		}},
		{"the peer is the client", "", map[string]string{
			"X-Forwarded-For": "203.0.113.7, 127.0.0.1",
			"Forwarded":       "for=203.0.113.7, for=127.0.0.1;proto=http",
			"X-Real-Ip":       "127.0.0.1",
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			hook := newTestHook(func(_ context.Context, r *exchange.Request) exchange.Decision {
				if tc.client != "" {
					r.Remote, r.Peer = netip.AddrPortFrom(netip.MustParseAddr(tc.client), 0), r.Remote
				}
				return exchange.Decision{Allow: true}
			})
			_, addr := startProxy(t, hook, svc, nil)
			c := dialClient(t, addr)
			c.send("GET / HTTP/1.1\r\nHost: x\r\nX-Forwarded-For: 203.0.113.7\r\nForwarded: for=203.0.113.7\r\n" +
				"X-Real-IP: 10.9.9.9\r\nX-Forwarded-Proto: https\r\n\r\n")
			if r, _ := c.resp("GET"); r.StatusCode != 200 {
				t.Fatalf("status %d", r.StatusCode)
			}
			h := <-seen
			for k, v := range tc.want {
				if got := strings.Join(h.Values(k), " | "); got != v {
					t.Errorf("%s: %q, want %q", k, got, v)
				}
			}
		})
	}
}
