package hook

import (
	"context"
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/rl-tproxy/rl-tproxy/pkg/admission"
	"github.com/rl-tproxy/rl-tproxy/pkg/exchange"
	"github.com/rl-tproxy/rl-tproxy/pkg/httpparse"
)

// TestClientAddressNamesRequestRemote: under client_address the Gate
// names the client a trusted peer's header gives in Request.Remote (the
// TCP peer going to Request.Peer), which the proxy's forwarding fields
// then name upstream; an untrusted peer's header changes nothing.
func TestClientAddressNamesRequestRemote(t *testing.T) {
	const block = "defaults:\n  client_address: {from: x-forwarded-for, trusted: [10.0.0.0/8]}\n"
	p, err := admission.Parse("p.yaml", []byte(block+fmt.Sprintf(testPolicyYAML, "close", "127.0.0.1:9")))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, peer       string
		remote, wantPeer string
	}{
		{"trusted peer", "10.0.0.1:1", "203.0.113.7:0", "10.0.0.1:1"},
		{"untrusted peer", "192.0.2.1:1", "192.0.2.1:1", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var head httpparse.Request
			if err := head.Parse([]byte("GET /open HTTP/1.1\r\nHost: h\r\nX-Forwarded-For: 198.51.100.9, 203.0.113.7\r\n\r\n"), httpparse.Limits{}); err != nil {
				t.Fatal(err)
			}
			r := &exchange.Request{Remote: netip.MustParseAddrPort(tc.peer), Local: netip.MustParseAddrPort("127.0.0.1:1"),
				Head: &head, Path: []byte("/open"), Start: time.Now()}
			g := New(Config{})
			g.SetChecker(&countingChecker{fn: allowAll}, nil)
			g.Swap(p)
			d := admitVia(g, context.Background(), r)
			if !d.Allow {
				t.Fatalf("denied: %+v", d)
			}
			var wantPeer netip.AddrPort
			if tc.wantPeer != "" {
				wantPeer = netip.MustParseAddrPort(tc.wantPeer)
			}
			if r.Remote != netip.MustParseAddrPort(tc.remote) || r.Peer != wantPeer {
				t.Errorf("Remote %v Peer %v, want %v and %v", r.Remote, r.Peer, tc.remote, wantPeer)
			}
			g.Done(r, &d, &exchange.Result{Status: 200, End: time.Now()})
		})
	}
}
