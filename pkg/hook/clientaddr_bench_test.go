package hook

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rl-tproxy/rl-tproxy/pkg/admission"
	"github.com/rl-tproxy/rl-tproxy/pkg/exchange"
	"github.com/rl-tproxy/rl-tproxy/pkg/httpparse"
)

// BenchmarkAdmitDoneClientAddress is an allow's Admit and Done with and
// without client_address (X-Forwarded-For, the peer trusted), on the
// same request carrying an X-Forwarded-For header: the difference is
// what naming the client behind a balancer costs the hook per request.
func BenchmarkAdmitDoneClientAddress(b *testing.B) {
	for _, c := range []struct{ name, setting string }{
		{"without", ""},
		{"with", "    client_address: {from: x-forwarded-for, trusted: [10.0.0.0/8]}\n"},
	} {
		b.Run(c.name, func(b *testing.B) {
			g, r := quietGate(b, "close", allowAll)
			body := strings.Replace(testPolicyYAML, "    upstream: %s\n", "    upstream: %s\n"+c.setting, 1)
			path := filepath.Join(b.TempDir(), "policy.yaml")
			if err := os.WriteFile(path, []byte(fmt.Sprintf(body, "close", "127.0.0.1:9")), 0o644); err != nil {
				b.Fatal(err)
			}
			p, err := admission.Load(path)
			if err != nil {
				b.Fatal(err)
			}
			g.Swap(p)
			var head httpparse.Request
			raw := []byte("GET /api/x HTTP/1.1\r\nHost: example.com\r\nX-Key: alice\r\nX-Forwarded-For: 198.51.100.9, 203.0.113.7\r\n\r\n")
			if err := head.Parse(raw, httpparse.Limits{}); err != nil {
				b.Fatal(err)
			}
			r.Head = &head
			ctx := context.Background()
			res := &exchange.Result{Status: 200, End: time.Now()}
			peer := r.Remote
			b.ReportAllocs()
			for b.Loop() {
				// A new request from the balancer, as the proxy builds
				// one per request: the Gate names the client in
				// r.Remote.
				r.Remote, r.Peer = peer, netip.AddrPort{}
				d := admitVia(g, ctx, r)
				g.Done(r, &d, res)
			}
		})
	}
}
