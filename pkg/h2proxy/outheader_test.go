package h2proxy

import (
	"net/http"
	"net/netip"
	"testing"

	"github.com/rl-tproxy/rl-tproxy/pkg/exchange"
	"github.com/rl-tproxy/rl-tproxy/pkg/httpparse"
)

// TestOutHeader: the upstream request shares the client's header only
// when nothing would change it; otherwise it is a copy with the
// connection-specific fields gone and the forwarding fields added, and
// the client's header is left as it was.
func TestOutHeader(t *testing.T) {
	fwd := &exchange.Decision{Allow: true, Forward: []httpparse.Header{{Name: []byte("X-Id"), Value: []byte("h")}}}
	fwd2 := &exchange.Decision{Allow: true, Forward: []httpparse.Header{
		{Name: []byte("x-id"), Value: []byte("h1")}, {Name: []byte("X-Other"), Value: []byte("o")}, {Name: []byte("X-ID"), Value: []byte("h2")},
	}}
	tests := []struct {
		name   string
		in     http.Header
		svc    exchange.Service
		d      *exchange.Decision
		shared bool
		want   http.Header // nil: same as in
	}{
		{"plain", http.Header{"Accept": {"*/*"}}, exchange.Service{}, nil, true, nil},
		{"te trailers", http.Header{"Te": {"trailers"}}, exchange.Service{}, &exchange.Decision{Allow: true}, true, nil},
		{"te other", http.Header{"Te": {"gzip"}, "A": {"1"}}, exchange.Service{}, nil, false, http.Header{"A": {"1"}}},
		{"te empty", http.Header{"Te": {}, "A": {"1"}}, exchange.Service{}, nil, false, http.Header{"A": {"1"}}},
		{"trailer field", http.Header{"Trailer": {"X"}, "A": {"1"}}, exchange.Service{}, nil, false, http.Header{"A": {"1"}}},
		{"http2-settings", http.Header{"Http2-Settings": {"AAMAAABk"}, "A": {"1"}}, exchange.Service{}, nil, false, http.Header{"A": {"1"}}},
		{"xff", http.Header{"A": {"1"}}, exchange.Service{XForwardedFor: true}, nil, false, http.Header{"A": {"1"}, "X-Forwarded-For": {"192.0.2.1"}}},
		{"real ip", http.Header{}, exchange.Service{XRealIP: true}, nil, false, http.Header{"X-Real-Ip": {"192.0.2.1"}}},
		{"hook fields", http.Header{"X-Id": {"client"}, "A": {"1"}}, exchange.Service{}, fwd, false, http.Header{"X-Id": {"h"}, "A": {"1"}}},
		{"hook fields, repeated name", http.Header{"X-Id": {"client", "c2"}}, exchange.Service{}, fwd2, false,
			http.Header{"X-Id": {"h1", "h2"}, "X-Other": {"o"}}},
		{"hook fields and xff", http.Header{"X-Forwarded-For": {"198.51.100.7"}}, exchange.Service{XForwardedFor: true}, fwd, false,
			http.Header{"X-Id": {"h"}, "X-Forwarded-For": {"198.51.100.7, 192.0.2.1"}}},
		{"nil header", nil, exchange.Service{}, nil, false, http.Header{}},
		{"values with spare capacity", http.Header{"A": append(make([]string, 0, 4), "1"), "Te": {"gzip"}}, exchange.Service{}, nil, false,
			http.Header{"A": {"1"}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			peer := netip.MustParseAddrPort("192.0.2.1:5")
			st := &stream{h: &conn{svc: &tt.svc, remote: peer}}
			st.req.Remote = peer
			before := tt.in.Clone()
			r := &http.Request{Header: tt.in}
			got := outHeader(r, st, tt.d)
			if isShared := got != nil && tt.in != nil && sameMap(got, tt.in); isShared != tt.shared {
				t.Fatalf("shared = %v, want %v", isShared, tt.shared)
			}
			want := tt.want
			if want == nil {
				want = tt.in
			}
			if !equalHeader(got, want) {
				t.Fatalf("got %v, want %v", got, want)
			}
			if !tt.shared { // a copy: appending to it leaves the client's values alone
				for k := range got {
					got[k] = append(got[k], "appended")
				}
			}
			if !equalHeader(tt.in, before) {
				t.Fatalf("client header changed: %v, was %v", tt.in, before)
			}
		})
	}
}

// TestOutHeaderNamesClient: the forwarding fields name the stream's
// Request.Remote, which a Hook set to the client a trusted balancer named
// (client_address), not the TCP peer; X-Forwarded-For and Forwarded keep
// the balancer's list in front.
func TestOutHeaderNamesClient(t *testing.T) {
	all := exchange.Service{XForwardedFor: true, XForwardedProto: true, Forwarded: true, XRealIP: true}
	peer := netip.MustParseAddrPort("192.0.2.1:5")
	for _, tc := range []struct {
		name   string
		client netip.AddrPort // zero: the peer is the client
		in     http.Header
		want   http.Header
	}{
		{"named by the hook", netip.MustParseAddrPort("203.0.113.7:0"),
			http.Header{"X-Forwarded-For": {"203.0.113.7"}, "X-Real-Ip": {"10.9.9.9"}, "Forwarded": {"for=203.0.113.7"}, "X-Forwarded-Proto": {"https"}},
			http.Header{"X-Forwarded-For": {"203.0.113.7, 203.0.113.7"}, "X-Forwarded-Proto": {"http"}, "X-Real-Ip": {"203.0.113.7"},
				"Forwarded": {"for=203.0.113.7, for=203.0.113.7;proto=http"}}},
		{"ipv6 named by the hook", netip.MustParseAddrPort("[2001:db8::7]:0"), http.Header{},
			http.Header{"X-Forwarded-For": {"2001:db8::7"}, "X-Forwarded-Proto": {"http"}, "X-Real-Ip": {"2001:db8::7"},
				"Forwarded": {`for="[2001:db8::7]";proto=http`}}},
		{"the peer is the client", netip.AddrPort{}, http.Header{"X-Forwarded-For": {"198.51.100.1"}},
			http.Header{"X-Forwarded-For": {"198.51.100.1, 192.0.2.1"}, "X-Forwarded-Proto": {"http"}, "X-Real-Ip": {"192.0.2.1"},
				"Forwarded": {"for=192.0.2.1;proto=http"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st := &stream{h: &conn{svc: &all, remote: peer}}
			st.req.Remote = peer
			if tc.client.IsValid() {
				st.req.Remote, st.req.Peer = tc.client, peer
			}
			if got := outHeader(&http.Request{Header: tc.in}, st, &exchange.Decision{Allow: true}); !equalHeader(got, tc.want) {
				t.Fatalf("got %v, want %v", got, tc.want)
			}
		})
	}
}

// sameMap reports whether a and b are the same map (a write to one shows
// in the other).
func sameMap(a, b http.Header) bool {
	const probe = "X-Probe-Same-Map"
	a[probe] = nil
	_, ok := b[probe]
	delete(a, probe)
	return ok
}

func equalHeader(a, b http.Header) bool {
	if len(a) != len(b) {
		return false
	}
	for k, va := range a {
		vb, ok := b[k]
		if !ok || len(va) != len(vb) {
			return false
		}
		for i := range va {
			if va[i] != vb[i] {
				return false
			}
		}
	}
	return true
}
