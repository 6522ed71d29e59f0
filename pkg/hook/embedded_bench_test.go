package hook

import (
	"context"
	"crypto/rand"
	"net/netip"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/rl-tproxy/rl-tproxy/internal/testkit"
	"github.com/rl-tproxy/rl-tproxy/pkg/admission"
	"github.com/rl-tproxy/rl-tproxy/pkg/embedded"
	"github.com/rl-tproxy/rl-tproxy/pkg/httpparse"
	"github.com/rl-tproxy/rl-tproxy/pkg/proxy"
	"github.com/rl-tproxy/rl-tproxy/pkg/ratelimitly"
	"github.com/rl-tproxy/rl-tproxy/pkg/ratelimitly/credentials"
	"github.com/rl-tproxy/rl-tproxy/pkg/rlclient"
)

// BenchmarkAdmitEmbedded measures one whole admission (render, encode,
// seal, UDP round trip to an embedded rlserver on loopback, open, decode,
// allow contract) plus Done with its latency report.
func BenchmarkAdmitEmbedded(b *testing.B) {
	var c credentials.Credential
	c.Tenant, c.KeyID = "bench", 1
	if _, err := rand.Read(c.Secret[:]); err != nil {
		b.Fatal(err)
	}
	e, err := embedded.Start(embedded.Config{Credentials: []credentials.Credential{c}})
	if err != nil {
		b.Fatal(err)
	}
	defer e.Close()
	cl, err := rlclient.New(rlclient.Config{SRV: e.SRV, Resolver: e.Resolver, Credential: c, Policy: ratelimitly.Standard(20 * time.Millisecond)})
	if err != nil {
		b.Fatal(err)
	}
	defer cl.Close()
	testkit.WaitFor(b, "discovery", cl.Ready)
	dir := b.TempDir()
	path := filepath.Join(dir, "policy.yaml")
	pol := `ratelimitly:
  embedded: true
zones:
  z: {bucket: "k:{header.x-key}", rate: 1000000000/s}
trackers:
  t: {service: "svc:{host}"}
services:
  - name: web
    listen: 127.0.0.1:1
    upstream: 127.0.0.1:9
    locations:
      - name: all
        limit: [z]
        guard: [{tracker: t, threshold: 250ms}]
        report: t
`
	if err := os.WriteFile(path, []byte(pol), 0o644); err != nil {
		b.Fatal(err)
	}
	p, err := admission.Load(path)
	if err != nil {
		b.Fatal(err)
	}
	g, r := quietGate(b, "close", allowAll)
	g.Swap(p)
	gc := NewClient(cl)
	g.SetChecker(gc, nil)
	var head httpparse.Request
	if err := head.Parse([]byte("GET /x HTTP/1.1\r\nHost: example.com\r\nX-Key: alice\r\n\r\n"), httpparse.Limits{}); err != nil {
		b.Fatal(err)
	}
	r.Head, r.Path, r.Local = &head, []byte("/x"), netip.MustParseAddrPort("127.0.0.1:1")
	r.Service = &proxy.Service{Name: "web"}
	ctx := context.Background()
	res := &proxy.Result{Status: 200}
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		r.Start = time.Now()
		res.End = r.Start.Add(time.Millisecond) // fast responses: the guard stays open
		d := g.Admit(ctx, r)
		if !d.Allow {
			st := d.State.(*state)
			b.Fatalf("denied: status %d cause %v", d.Status, st.dec.Cause)
		}
		g.Done(r, &d, res)
	}
}
