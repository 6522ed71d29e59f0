package exchange

import (
	"net/http"
	"net/netip"
	"strings"
	"testing"
)

// TestIsHopByHop: the predicate agrees with the table in every case
// spelling, for strings and bytes, and takes nothing else.
func TestIsHopByHop(t *testing.T) {
	for _, k := range HopByHop {
		if http.CanonicalHeaderKey(k) != k {
			t.Errorf("%q is not canonical", k)
		}
		for _, n := range []string{k, strings.ToLower(k), strings.ToUpper(k)} {
			if !IsHopByHop(n) || !IsHopByHop([]byte(n)) {
				t.Errorf("IsHopByHop(%q) false", n)
			}
		}
	}
	for _, n := range []string{"", "t", "tee", "Host", "Trailers", "Upgrade-Insecure-Requests", "Connections", "Keep_Alive", "Http2-Settings", "X-Forwarded-For", "Content-Length"} {
		if IsHopByHop(n) || IsHopByHop([]byte(n)) {
			t.Errorf("IsHopByHop(%q) true", n)
		}
	}
	for _, n := range []string{"Http2-Settings", "HTTP2-Settings", "http2-settings"} {
		if !IsHTTP2Settings(n) || !IsHTTP2Settings([]byte(n)) {
			t.Errorf("IsHTTP2Settings(%q) false", n)
		}
	}
	if IsHTTP2Settings("Http2-Setting") || IsHTTP2Settings("Http3-Settings") {
		t.Error("IsHTTP2Settings takes another name")
	}
}

// TestForwardFields: names, keys and the lookup agree; each service flag
// adds its field and only it.
func TestForwardFields(t *testing.T) {
	for _, f := range ForwardFields {
		if http.CanonicalHeaderKey(f.Name()) != f.Key() {
			t.Errorf("%v: key %q is not the canonical %q", f, f.Key(), f.Name())
		}
		for _, n := range []string{f.Name(), f.Key(), strings.ToLower(f.Name()), strings.ToUpper(f.Name())} {
			if ForwardFieldOf(n) != f || ForwardFieldOf([]byte(n)) != f {
				t.Errorf("ForwardFieldOf(%q) = %v, want %v", n, ForwardFieldOf(n), f)
			}
		}
	}
	for _, n := range []string{"", "X-Forwarded", "X-Forwarded-Host", "Forwarded-For", "X-Real-IPs", "x-forwarded-fox", "Via"} {
		if f := ForwardFieldOf(n); f != 0 {
			t.Errorf("ForwardFieldOf(%q) = %v", n, f)
		}
	}
	for _, tc := range []struct {
		svc  Service
		want ForwardField
	}{
		{Service{XForwardedFor: true}, FieldXForwardedFor},
		{Service{XForwardedProto: true}, FieldXForwardedProto},
		{Service{Forwarded: true}, FieldForwarded},
		{Service{XRealIP: true}, FieldXRealIP},
	} {
		if !tc.svc.AddsForwarding() {
			t.Errorf("%v: AddsForwarding false", tc.want)
		}
		for _, f := range ForwardFields {
			if got := tc.svc.Adds(f); got != (f == tc.want) {
				t.Errorf("service adding %v: Adds(%v) = %v", tc.want, f, got)
			}
		}
	}
	if (&Service{}).AddsForwarding() {
		t.Error("a service without forwarding fields adds one")
	}
	if !FieldXForwardedFor.AppendsPrior() || !FieldForwarded.AppendsPrior() || FieldXRealIP.AppendsPrior() || FieldXForwardedProto.AppendsPrior() {
		t.Error("AppendsPrior: only X-Forwarded-For and Forwarded are lists")
	}
}

func TestForwardValue(t *testing.T) {
	v4, v6, mapped := netip.MustParseAddr("203.0.113.7"), netip.MustParseAddr("2001:db8::7"), netip.MustParseAddr("::ffff:203.0.113.7")
	for _, tc := range []struct {
		f    ForwardField
		ip   netip.Addr
		want string
	}{
		{FieldXForwardedFor, v4, "203.0.113.7"},
		{FieldXForwardedFor, v6, "2001:db8::7"},
		{FieldXForwardedFor, mapped, "203.0.113.7"},
		{FieldXRealIP, v6, "2001:db8::7"},
		{FieldXForwardedProto, v4, "http"},
		{FieldForwarded, v4, "for=203.0.113.7;proto=http"},
		{FieldForwarded, v6, `for="[2001:db8::7]";proto=http`},
		{FieldForwarded, mapped, "for=203.0.113.7;proto=http"},
	} {
		if got := string(tc.f.AppendValue([]byte("p:"), tc.ip)); got != "p:"+tc.want {
			t.Errorf("%v %v: %q, want %q", tc.f, tc.ip, got, "p:"+tc.want)
		}
	}
}
