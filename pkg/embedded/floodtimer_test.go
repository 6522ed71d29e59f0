package embedded

import (
	"testing"
	"time"

	"github.com/rl-tproxy/rl-tproxy/pkg/evloop"
	"github.com/rl-tproxy/rl-tproxy/pkg/rlserver"
)

// TestFloodServedOnceAmongManyTimers: on a loop with many other timers
// armed (every proxy connection has one), a flood is served at most
// ServeTurns batches per turn. The "serve the rest next turn" timer was
// Reset to l.Now(), due in the same turn's timer run, which fired it
// again up to once per armed timer: one turn served 15 wake-ups' worth
// (reviewer's repro) while the loop's sockets waited.
func TestFloodServedOnceAmongManyTimers(t *testing.T) {
	eachBackend(t, func(t *testing.T, be evloop.Backend) {
		g := startLoops(t, be, 1)
		l := g.Loops()[0]
		c := testCred(t)
		e := startLoopDriven(t, 1, c)
		const others = 1000
		ts := make([]evloop.Timer, others)
		on(t, l, func() {
			for i := range ts {
				ts[i].Init(l, func() {})
				ts[i].Reset(l.Now() + int64(time.Hour))
			}
		})
		defer on(t, l, func() {
			for i := range ts {
				ts[i].Stop()
			}
		})
		p := newRawPeer(t, e, c)
		const flood = 16 * ServeTurns * rlserver.MaxBatch
		junk := make([]byte, 64)
		for i := 0; i < flood; i++ {
			p.send(junk)
		}
		var ds []func()
		atAttach := make(chan uint64, 1)
		nextTurn := make(chan uint64, 1)
		on(t, l, func() {
			d, err := e.LoopAttacher().AttachLoop(l)
			if err != nil {
				t.Error(err)
			}
			ds = append(ds, d)
			atAttach <- e.Server.Stats().Received
			// runs in the next turn's runPosted, after its runTimers
			l.Post(func() { nextTurn <- e.Server.Stats().Received })
		})
		defer detach(t, g, ds)
		a, b := <-atAttach, <-nextTurn
		bound := uint64(ServeTurns * rlserver.MaxBatch)
		t.Logf("served at attach %d, in the next turn %d (bound per wake-up %d)", a, b-a, bound)
		if b-a > bound {
			t.Fatalf("one turn served %d datagrams, %d wake-ups' worth", b-a, (b-a)/bound)
		}
	})
}
