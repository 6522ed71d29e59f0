package proxy

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"

	"github.com/rl-tproxy/rl-tproxy/pkg/exchange"
	"github.com/rl-tproxy/rl-tproxy/pkg/httpparse"
)

// nginxResponse is the head an nginx static backend answers with.
const nginxResponse = "HTTP/1.1 200 OK\r\nServer: nginx/1.22.1\r\nDate: Wed, 02 Dec 2026 15:00:00 GMT\r\n" +
	"Content-Type: text/html\r\nContent-Length: 612\r\nLast-Modified: Tue, 01 Dec 2026 10:00:00 GMT\r\n" +
	"Connection: keep-alive\r\nETag: \"6761-264\"\r\nAccept-Ranges: bytes\r\n\r\n"

// BenchmarkAppendResponseHead: the response head of every proxied request
// to an nginx backend (one Connection field naming keep-alive).
func BenchmarkAppendResponseHead(b *testing.B) {
	var r httpparse.Response
	if err := r.Parse([]byte(nginxResponse), httpparse.Limits{}, []byte("GET")); err != nil {
		b.Fatal(err)
	}
	buf := make([]byte, 0, 1024)
	b.ReportAllocs()
	for b.Loop() {
		buf = appendResponseHead(buf[:0], &r, nil, 0)
	}
}

// connectionFlood is a request within the default limits (16 KiB, 100
// fields) whose Connection field lists as many options as fit.
func connectionFlood(options int) string {
	var sb strings.Builder
	sb.WriteString("GET / HTTP/1.1\r\nHost: x\r\n")
	for i := range 97 {
		fmt.Fprintf(&sb, "X-F%d: v\r\n", i)
	}
	sb.WriteString("Connection: ")
	for i := range options {
		if i > 0 {
			sb.WriteByte(',')
		}
		fmt.Fprintf(&sb, "o%d", i)
	}
	sb.WriteString("\r\n\r\n")
	return sb.String()
}

// BenchmarkAppendRequestHeadConnectionFlood: the worst a client can make
// the request head's re-serialisation cost with Connection options, 97
// other fields beside them (2500 options fit the default limits; the
// parser refuses more than httpparse.MaxConnectionOptions, so that case
// skips).
func BenchmarkAppendRequestHeadConnectionFlood(b *testing.B) {
	for _, n := range []int{1, httpparse.MaxConnectionOptions, 2500} {
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			var h httpparse.Request
			if err := h.Parse([]byte(connectionFlood(n)), httpparse.Limits{}); err != nil {
				b.Skipf("%d options: %v", n, err)
			}
			svc := &exchange.Service{Name: "b", Upstream: "127.0.0.1:80"}
			remote := netip.MustParseAddrPort("192.0.2.1:5")
			buf := make([]byte, 0, 32<<10)
			b.ReportAllocs()
			for b.Loop() {
				buf = appendRequestHead(buf[:0], &h, svc, remote, nil)
			}
		})
	}
}

// BenchmarkAppendRequestHeadForwarding: a browser's request head through
// a balancer (with its X-Forwarded-For) to a service that adds every
// forwarding field.
func BenchmarkAppendRequestHeadForwarding(b *testing.B) {
	const head = "GET /api/items?page=2 HTTP/1.1\r\nHost: shop.example\r\nUser-Agent: Mozilla/5.0 (X11; Linux x86_64)\r\n" +
		"Accept: text/html,application/xhtml+xml\r\nAccept-Language: en-GB,en;q=0.9\r\nAccept-Encoding: gzip, br\r\n" +
		"Cookie: session=0123456789abcdef\r\nX-Forwarded-For: 203.0.113.7\r\nX-Forwarded-Proto: https\r\nConnection: keep-alive\r\n\r\n"
	var h httpparse.Request
	if err := h.Parse([]byte(head), httpparse.Limits{}); err != nil {
		b.Fatal(err)
	}
	svc := &exchange.Service{Name: "b", Upstream: "127.0.0.1:80", XForwardedFor: true, XForwardedProto: true, Forwarded: true, XRealIP: true}
	remote := netip.MustParseAddrPort("192.0.2.1:5")
	buf := make([]byte, 0, 4<<10)
	b.ReportAllocs()
	for b.Loop() {
		buf = appendRequestHead(buf[:0], &h, svc, remote, nil)
	}
}
