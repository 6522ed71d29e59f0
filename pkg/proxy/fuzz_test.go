package proxy

import (
	"bufio"
	"bytes"
	"net/http"
	"net/netip"
	"testing"

	"github.com/rl-tproxy/rl-tproxy/pkg/exchange"
	"github.com/rl-tproxy/rl-tproxy/pkg/httpparse"
)

// FuzzForwardHead: any head the strict parser accepts is re-serialised into
// a head that both our parser and net/http read with the same method,
// target and framing, with no hop-by-hop field left (the upstream sees one
// unambiguous framing, never a raw copy).
func FuzzForwardHead(f *testing.F) {
	for _, s := range []string{
		"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
		"POST /a?b=c HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nConnection: keep-alive, X-A\r\nX-A: 1\r\n\r\n",
		"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nTE: trailers\r\nExpect: 100-continue\r\n\r\n",
		"GET /ws HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n",
		"GET http://h:8/p HTTP/1.1\r\nHost: h:8\r\nX-Forwarded-For: 1.2.3.4\r\nForwarded: for=1.2.3.4\r\n\r\n",
		"GET / HTTP/1.0\r\n\r\n",
		"GET http://a.example?q HTTP/1.1\r\nHost: b.example\r\nConnection: host, content-length\r\n\r\n",
		"OPTIONS http://a.example HTTP/1.1\r\nHost: a.example\r\n\r\n",
		"GET / HTTP/1.1\r\nHost: x\r\nConnection: a, , B,keep-alive,c\r\nconnection: D, TE\r\nA: 1\r\nb: 2\r\nX-C: 3\r\nd: 4\r\nTE: trailers\r\n\r\n",
	} {
		f.Add([]byte(s), uint8(0xff))
	}
	strictLimits := httpparse.Limits{MaxRequestLine: 1 << 20, MaxHeaderBytes: 1 << 20, MaxHeaders: 1 << 16}
	f.Fuzz(func(t *testing.T, data []byte, opts uint8) {
		var h httpparse.Request
		if h.Parse(data, httpparse.Limits{}) != nil {
			return
		}
		svc := &exchange.Service{Name: "f", Upstream: "127.0.0.1:80", XForwardedFor: opts&1 != 0,
			XForwardedProto: opts&2 != 0, Forwarded: opts&4 != 0, XRealIP: opts&8 != 0}
		remote := netip.MustParseAddrPort("192.0.2.1:5")
		if opts&16 != 0 {
			remote = netip.MustParseAddrPort("[2001:db8::1]:5")
		}
		out := appendRequestHead(nil, &h, svc, remote, nil)
		var h2 httpparse.Request
		if err := h2.Parse(out, strictLimits); err != nil {
			t.Fatalf("re-serialised head rejected: %v\n%q\nfrom %q", err, out, data)
		}
		if !bytes.Equal(h2.Method, h.Method) || h2.Minor != 1 {
			t.Fatalf("request line changed: %q", out)
		}
		// The target goes in origin form with the same path and query;
		// its authority (or the Host field) is the one Host sent.
		p1, q1 := splitTarget(h.Target)
		p2, q2 := splitTarget(h2.Target)
		absolute := len(h.Target) > 0 && h.Target[0] != '/' && h.Target[0] != '*' && !httpparse.EqualFold(h.Method, "CONNECT")
		if absolute && len(p1) == 0 && (string(p2) == "/" || string(p2) == "*") {
			p2 = p1
		}
		if !bytes.Equal(p1, p2) || !bytes.Equal(q1, q2) || (q1 == nil) != (q2 == nil) ||
			absolute && h2.Target[0] != '/' && h2.Target[0] != '*' || !absolute && !bytes.Equal(h.Target, h2.Target) {
			t.Fatalf("target %q forwarded as %q", h.Target, h2.Target)
		}
		if (h.Host != nil || h.HostHeader != nil) && !bytes.Equal(h2.Host, h.Host) {
			t.Fatalf("host %q forwarded as %q: %q", h.Host, h2.Host, out)
		}
		if h2.BodyMode() != h.BodyMode() || h2.ContentLength != h.ContentLength {
			t.Fatalf("framing changed: %v/%d -> %v/%d\n%q", h.BodyMode(), h.ContentLength, h2.BodyMode(), h2.ContentLength, out)
		}
		if h2.Expect100 || h2.Upgrade != h.Upgrade {
			t.Fatalf("expect/upgrade: %q", out)
		}
		for _, f := range h2.Headers {
			if exchange.IsHopByHop(f.Name) && !(h.Upgrade && (httpparse.EqualFold(f.Name, "upgrade") || httpparse.EqualFold(f.Name, "connection"))) &&
				!(h.Chunked && httpparse.EqualFold(f.Name, "transfer-encoding")) {
				t.Fatalf("hop-by-hop %q forwarded: %q", f.Name, out)
			}
		}
		req, err := http.ReadRequest(bufio.NewReader(bytes.NewReader(out)))
		if err != nil {
			t.Fatalf("net/http rejects the forwarded head: %v\n%q", err, out)
		}
		switch h.BodyMode() {
		case httpparse.BodyChunked:
			if len(req.TransferEncoding) != 1 || req.TransferEncoding[0] != "chunked" {
				t.Fatalf("net/http framing %v", req.TransferEncoding)
			}
		case httpparse.BodyLength:
			if req.ContentLength != h.ContentLength {
				t.Fatalf("net/http length %d, want %d", req.ContentLength, h.ContentLength)
			}
		default:
			if req.ContentLength != 0 || len(req.TransferEncoding) != 0 {
				t.Fatalf("net/http sees a body: %d %v", req.ContentLength, req.TransferEncoding)
			}
		}
	})
}
