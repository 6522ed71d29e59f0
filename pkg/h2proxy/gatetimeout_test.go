package h2proxy_test

import (
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/rl-tproxy/rl-tproxy/internal/dnstest"
	"github.com/rl-tproxy/rl-tproxy/internal/testkit"
	"github.com/rl-tproxy/rl-tproxy/internal/testkit/rlcluster"
	"github.com/rl-tproxy/rl-tproxy/pkg/admission"
	"github.com/rl-tproxy/rl-tproxy/pkg/h2proxy"
	"github.com/rl-tproxy/rl-tproxy/pkg/hook"
	"github.com/rl-tproxy/rl-tproxy/pkg/ratelimitly"
	"github.com/rl-tproxy/rl-tproxy/pkg/rlclient"
)

// TestGateAdmissionTimeoutInline: the real gate, whose RateLimitly never
// answers (its only endpoint reads and drops every datagram) under a
// request policy whose horizon (60 s) outlasts the client's patience
// (20 s): the stream is answered 503 at the service's admission timeout,
// which only happens if the Gate's Admit returns when its context ends,
// since the gate is a exchange.ContextBound Hook, called on the stream's
// own goroutine (no Admit goroutine started).
func TestGateAdmissionTimeoutInline(t *testing.T) {
	silent, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	go func() { // read and drop until closed
		b := make([]byte, 2048)
		for {
			if _, _, err := silent.ReadFromUDP(b); err != nil {
				return
			}
		}
	}()
	cred := rlcluster.NewCredential(t, "h2", 1)
	dns := dnstest.Start(t)
	const srv = "_ratelimitly._udp.rl.test."
	dns.SetSRV(srv, rlcluster.Targets("rl.test.", netip.MustParseAddrPort(silent.LocalAddr().String()))...)
	cl, err := rlclient.New(rlclient.Config{SRV: srv, Resolver: dns.Addr(), Credential: cred,
		Policy: ratelimitly.Standard(20 * time.Second)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cl.Close() })
	testkit.WaitFor(t, "discovery", cl.Ready)
	path := filepath.Join(t.TempDir(), "policy.yaml")
	pol := `ratelimitly: {embedded: true}
zones:
  z: {bucket: "z:{host}", rate: 100/s}
services:
  - name: s
    listen: 127.0.0.1:1
    upstream: 127.0.0.1:9
    locations:
      - name: all
        limit: [z]
`
	if err := os.WriteFile(path, []byte(pol), 0o600); err != nil {
		t.Fatal(err)
	}
	p, err := admission.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	g := hook.New(hook.Config{AccessLog: slog.New(slog.DiscardHandler)})
	g.Swap(p)
	g.SetChecker(hook.NewClient(cl), nil)
	svc := hook.ProxyServices(p)[0]
	svc.AdmissionTimeout = admitTimeout
	_, addr := startProxy(t, svc, g)

	before := h2proxy.AdmitGoroutines.Load()
	hc := h2cClient()
	hc.Timeout = clientBound
	defer hc.CloseIdleConnections()
	if got := getStatus(t, hc, "http://"+addr+"/x"); got != 503 {
		t.Fatalf("status %d, want 503 at the admission timeout", got)
	}
	if n := h2proxy.AdmitGoroutines.Load() - before; n != 0 {
		t.Fatalf("%d Admit goroutines for a ContextBound hook, want 0", n)
	}
}
