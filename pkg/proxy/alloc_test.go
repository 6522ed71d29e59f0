//go:build !race

// Allocation tests (testing.AllocsPerRun). Their counts are meaningless
// under -race (the detector allocates, sync.Pool drops items), so this file
// is left out of the race run and `make test-alloc` runs it without -race.
// Every test here has "Alloc" in its name: that pass selects them by it.

package proxy

import "testing"

// TestAllocsPerProxiedRequest pins the steady-state allocation count of a
// proxied keep-alive GET (proxy, loopback upstream and client in one
// process; the client and upstream do not allocate).
func TestAllocsPerProxiedRequest(t *testing.T) {
	if testing.Short() {
		t.Skip("short")
	}
	for _, tc := range []struct {
		name string
		hook Hook
		max  float64
	}{
		{"no-hook", nil, 0},
		// The *net.OpError the runtime returns to the client-abort watcher
		// when a past deadline wakes it after Admit.
		{"hook", allowHook{}, 1},
		// An OnDemandWatcher that asks for no watch: no watcher, no error.
		{"on-demand-hook-unwatched", onDemandAllowHook{}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			up := fastUpstream(t, fixedResponse)
			_, addr := startProxy(t, tc.hook, &Service{Name: "a", Upstream: up, XForwardedFor: true}, nil)
			bc := newBenchClient(t, addr)
			for i := 0; i < 100; i++ { // warm pools
				if err := bc.roundTrip(); err != nil {
					t.Fatal(err)
				}
			}
			allocs := testing.AllocsPerRun(500, func() {
				if err := bc.roundTrip(); err != nil {
					t.Fatal(err)
				}
			})
			t.Logf("allocs per proxied request: %.2f", allocs)
			if allocs > tc.max {
				t.Fatalf("allocs per proxied request %.2f > %.0f", allocs, tc.max)
			}
		})
	}
}

// onDemandAllowHook allows everything and never asks for a watch.
type onDemandAllowHook struct{ allowHook }

func (onDemandAllowHook) WatchesOnDemand() {}
