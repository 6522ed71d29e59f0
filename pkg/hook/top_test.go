package hook

import (
	"context"
	"testing"
	"time"

	"github.com/rl-tproxy/rl-tproxy/pkg/admission"
	"github.com/rl-tproxy/rl-tproxy/pkg/exchange"
	"github.com/rl-tproxy/rl-tproxy/pkg/ratelimitly"
	"github.com/rl-tproxy/rl-tproxy/pkg/ratelimitly/wire"
	"github.com/rl-tproxy/rl-tproxy/pkg/topkeys"
)

// topGate is quietGate with a top-keys registry whose clock is the
// request's start.
func topGate(t testing.TB, fail string, fn func(context.Context, *wire.RateRequest, *admission.CheckResult)) (*Gate, *exchange.Request, *topkeys.Registry) {
	g, r := quietGate(t, fail, fn)
	reg := topkeys.NewRegistry(topkeys.Plain, func() time.Time { return r.Start })
	g.top = reg
	p, _ := g.Policy()
	g.Swap(p) // the zones get their summaries
	return g, r, reg
}

// Allows and short zones of denies (RateLimitly's and the local
// fallback's) reach the zone's summary under the rendered bucket; a
// failure that admits or denies without a decision does not count.
func TestTopFromDone(t *testing.T) {
	for _, tc := range []struct {
		name           string
		fail           string
		fn             func(context.Context, *wire.RateRequest, *admission.CheckResult)
		denies, allows uint64
	}{
		{"allow", "close", allowAll, 0, 3},
		{"deny", "close", denyResource, 3, 0},
		{"fail close", "close", failWith(ratelimitly.CauseTimeout), 0, 0},
		{"fail open", "open", failWith(ratelimitly.CauseTimeout), 0, 0},
		{"local", "local", failWith(ratelimitly.CauseNoEndpoints), 1, 2}, // burst 2
	} {
		t.Run(tc.name, func(t *testing.T) {
			g, r, reg := topGate(t, tc.fail, tc.fn)
			for range 3 {
				d := admitVia(g, context.Background(), r)
				g.Done(r, &d, &exchange.Result{Status: 200, End: r.Start})
			}
			a, ok := reg.Top("per_key", 10)
			if !ok {
				t.Fatal("zone per_key missing")
			}
			keys := a.Zones[0].Keys
			if tc.denies == 0 {
				if len(keys) != 0 {
					t.Fatalf("keys %+v", keys)
				}
				// allows are only shown with a denied key: deny once
				reg.Zone("per_key").Deny([]byte("k:alice"), r.Start.UnixNano())
				a, _ = reg.Top("per_key", 10)
				keys = a.Zones[0].Keys
			}
			if len(keys) != 1 || keys[0].Key != "k:alice" || keys[0].Denies != max(tc.denies, 1) || keys[0].Allows != tc.allows {
				t.Fatalf("keys %+v, want k:alice with %d denies and %d allows", keys, tc.denies, tc.allows)
			}
		})
	}
}

// A reload that drops a zone drops its summary.
func TestTopRetainOnSwap(t *testing.T) {
	g, _, reg := topGate(t, "close", allowAll)
	if _, ok := reg.Top("per_key", 1); !ok {
		t.Fatal("no summary for per_key")
	}
	p, _ := g.Policy()
	empty := *p
	empty.Services = nil
	g.Swap(&empty)
	if _, ok := reg.Top("per_key", 1); ok {
		t.Fatal("per_key kept after a policy without it")
	}
}
