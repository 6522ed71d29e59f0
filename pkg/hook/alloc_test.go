//go:build !race

// Allocation tests (testing.AllocsPerRun). Their counts are meaningless
// under -race (the detector allocates, sync.Pool drops items), so this file
// is left out of the race run and `make test-alloc` runs it without -race.
// Every test here has "Alloc" in its name: that pass selects them by it.

package hook

import (
	"context"
	"testing"
	"time"

	"github.com/rl-tproxy/rl-tproxy/pkg/admission"
	"github.com/rl-tproxy/rl-tproxy/pkg/proxy"
	"github.com/rl-tproxy/rl-tproxy/pkg/ratelimitly"
	"github.com/rl-tproxy/rl-tproxy/pkg/ratelimitly/wire"
)

// Admit and Done allocate nothing in steady state (access log off), for
// allows and for denies with their answer headers.
func TestAdmitDoneNoAlloc(t *testing.T) {
	for _, c := range []struct {
		name string
		fn   func(context.Context, *wire.RateRequest, *admission.CheckResult)
		fail string
	}{{"allow", allowAll, "close"}, {"deny", denyResource, "close"}, {"fail", failWith(ratelimitly.CauseTimeout), "close"},
		{"local", failWith(ratelimitly.CauseNoEndpoints), "local"}} {
		g, r := quietGate(t, c.fail, c.fn)
		ctx := context.Background()
		res := &proxy.Result{Status: 200, End: time.Now()}
		run := func() {
			d := g.Admit(ctx, r)
			g.Done(r, &d, res)
		}
		run()
		if n := testing.AllocsPerRun(200, run); n != 0 {
			t.Errorf("%s: Admit+Done allocate %v per request", c.name, n)
		}
	}
}
