package rlclient

import (
	"testing"
	"time"

	"github.com/rl-tproxy/rl-tproxy/pkg/ratelimitly"
)

// pacedGap spaces BenchmarkRingsLoopPaced's checks: longer than the
// default unit (20 ms), so every check's first-round deadline is in the
// future of the previous one's.
const pacedGap = 25 * time.Millisecond

// pacedDone is BenchmarkRingsLoopPaced's LoopCompleter.
type pacedDone chan bool

func (p pacedDone) CheckDone(*Decision, error)       { p <- false }
func (p pacedDone) CheckDoneOnLoop(*Decision, error) { p <- true }

// BenchmarkRingsLoopPaced is a quiet service's admission load: one loop,
// one check at a time, a new one every pacedGap, standard policy at the
// default unit, answered by one node (child process). cpu-µs/op and
// ctxsw/op are the client process's per check, pacing included (the same
// for every build): what differs is what a check's deadline costs when
// nothing else keeps the timer busy.
func BenchmarkRingsLoopPaced(b *testing.B) {
	cl := startBenchCluster(b, 1)
	c := newTestClient(b, cl.dns.Addr(), clientOpts{shards: 1, loops: 1, policy: ratelimitly.Standard(ratelimitly.DefaultUnit)})
	waitReady(b, c)
	h := startLoops(b, c, 1)
	l := h.g.Loops()[0]
	req := testRequest()
	var dec Decision
	done := make(pacedDone, 1)
	start := func() {
		if _, decided, _ := c.CheckAsyncLoop(0, req, &dec, done); decided {
			done <- true
		}
	}
	offLoop := 0
	b.ResetTimer()
	m := startMeter(b, cl)
	for range b.N {
		time.Sleep(pacedGap)
		l.Post(start)
		if !<-done {
			offLoop++
		}
	}
	b.StopTimer()
	m.report(b)
	b.ReportMetric(float64(offLoop)/float64(b.N), "offloop/op")
	if st := c.Stats(); st.Causes[CauseAllow] != uint64(b.N) {
		b.Errorf("%d allowed of %d", st.Causes[CauseAllow], b.N)
	}
	h.stop(b)
}
