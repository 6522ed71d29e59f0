//go:build !race

package admission

import (
	"testing"

	"github.com/rl-tproxy/rl-tproxy/pkg/ratelimitly"
)

// TestTierRenderNoAlloc: looking up tiered numbers allocates nothing.
func TestTierRenderNoAlloc(t *testing.T) {
	p := ptLoad(t, tierPolicy)
	loc := p.Services[0].Locations[0]
	r := tierRequest("pro", "tier=gold")
	var d Decision
	d.Reset()
	Build(loc, r, &d)
	n := testing.AllocsPerRun(200, func() {
		d.Reset()
		if Build(loc, r, &d) != ratelimitly.CauseAllow {
			t.Fatal("build failed")
		}
	})
	if n > 0 {
		t.Fatalf("Build with tiers allocates %v per request", n)
	}
}
