package admission

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/rl-tproxy/rl-tproxy/pkg/proxyproto"
)

const ptTLS = ptEmbedded + `zones:
  per_sni: {bucket: "sni:{sni}:{alpn}:{remote_addr}", rate: 3/m}
services:
  - name: tls
    port: 443
    upstream: 127.0.0.1:8443
    tls: passthrough
    opaque: reject
    proxy_protocol: v2
    locations:
      - name: api
        match: {sni: ["api.example.com", "*.api.example.com"]}
        limit: [per_sni]
      - name: rest
  - name: web
    port: 80
    upstream: 127.0.0.1:8080
    proxy_protocol: v1
`

func TestLoadProtocols(t *testing.T) {
	p := ptLoad(t, ptTLS)
	tls, web := p.Services[0], p.Services[1]
	if tls.TLS != TLSPassthrough || tls.Opaque != OpaqueReject || tls.ProxyProtocol != proxyproto.V2 {
		t.Fatalf("tls service: %v %v %v", tls.TLS, tls.Opaque, tls.ProxyProtocol)
	}
	if web.TLS != TLSOpaque || web.Opaque != OpaquePassthrough || web.ProxyProtocol != proxyproto.V1 {
		t.Fatalf("defaults: %v %v %v", web.TLS, web.Opaque, web.ProxyProtocol)
	}
	conn := &Request{Remote: netip.MustParseAddrPort("192.0.2.9:4000"), SNI: []byte("X.API.Example.com"), ALPN: []byte("h2")}
	loc := tls.Match(conn)
	if loc == nil || loc.Name != "api" {
		t.Fatalf("matched %v", loc)
	}
	b, err := loc.Limits[0].Bucket.Render(nil, conn)
	if err != nil || string(b) != "sni:x.api.example.com:h2:192.0.2.9" {
		t.Fatalf("bucket %q %v", b, err)
	}
	// An HTTP request (no SNI) never matches an sni location.
	if loc := tls.Match(&Request{Host: []byte("api.example.com"), Path: []byte("/")}); loc == nil || loc.Name != "rest" {
		t.Fatalf("http request matched %v", loc)
	}
	if loc := tls.Match(&Request{SNI: []byte("example.com")}); loc == nil || loc.Name != "rest" {
		t.Fatalf("other sni matched %v", loc)
	}
}

func TestLoadProtocolErrors(t *testing.T) {
	svc := "services:\n  - name: s\n    port: 443\n    upstream: 127.0.0.1:1\n"
	for _, tt := range []struct{ extra, want string }{
		{"    tls: terminate\n", `tls: want passthrough, reject or opaque, got "terminate"`},
		{"    opaque: drop\n", `opaque: want passthrough or reject, got "drop"`},
		{"    proxy_protocol: v3\n", `proxy_protocol: want v1 or v2, got "v3"`},
		{"    proxy_protocol: true\n", `proxy_protocol`},
		{"    locations:\n      - match: {sni: [a.example]}\n", "matches on sni, which needs tls: passthrough"},
		{"    tls: passthrough\n    locations:\n      - match: {sni: [\"a b\"]}\n", `bad sni "a b"`},
	} {
		_, err := Load(ptWrite(t, ptEmbedded+svc+tt.extra, ""))
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%q: got %v, want %q", tt.extra, err, tt.want)
		}
	}
}
