//go:build !race

package hook

import (
	"context"
	"testing"

	"github.com/rl-tproxy/rl-tproxy/pkg/exchange"
	"github.com/rl-tproxy/rl-tproxy/pkg/ratelimitly"
)

// With top keys on, Admit and Done still allocate nothing, for allows,
// denies and local decisions.
func TestTopAdmitDoneAlloc(t *testing.T) {
	for _, c := range []struct {
		name string
		fail string
		ok   bool
	}{{"allow", "close", true}, {"deny", "close", false}, {"local", "local", false}} {
		fn := allowAll
		if !c.ok {
			fn = denyResource
		}
		if c.fail == "local" {
			fn = failWith(ratelimitly.CauseNoEndpoints)
		}
		g, r, _ := topGate(t, c.fail, fn)
		res := &exchange.Result{Status: 200, End: r.Start}
		run := func() {
			d := g.Admit(context.Background(), r)
			g.Done(r, &d, res)
		}
		run()
		if n := testing.AllocsPerRun(200, run); n != 0 {
			t.Errorf("%s: %v allocations per request with top keys", c.name, n)
		}
	}
}
