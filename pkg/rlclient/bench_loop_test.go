package rlclient

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/rl-tproxy/rl-tproxy/pkg/evloop"
	"github.com/rl-tproxy/rl-tproxy/pkg/ratelimitly"
	"github.com/rl-tproxy/rl-tproxy/pkg/ratelimitly/wire"
)

// BenchmarkRingsLoop256 keeps 256 checks in flight the way the proxy
// drives the client: GOMAXPROCS event loops (pkg/evloop), the client
// attached to each (Config.LoopShards, AttachLoop), 256/loops checks per
// loop started with CheckAsyncLoop; each completion on the loop
// (CheckDoneOnLoop) records the decision and starts the next check on
// the same loop, and the datagrams of a turn leave at its end. One node,
// as RingsAsync256 and Naive256.
func BenchmarkRingsLoop256(b *testing.B) {
	cl := startBenchCluster(b, 1)
	n := runtimeProcs()
	c := newTestClient(b, cl.dns.Addr(), clientOpts{shards: n, loops: n, policy: ratelimitly.Standard(time.Second)})
	waitReady(b, c)
	h := startLoops(b, c, n)
	d := &loopDriver{c: c, req: testRequest(), lat: newLatencies(b.N), total: int64(b.N), done: make(chan struct{})}
	d.left.Store(int64(b.N))
	slots := make([]loopSlot, 256)
	for i := range slots {
		slots[i] = loopSlot{d: d, loop: i % n, l: h.g.Loops()[i%n]}
		slots[i].post = slots[i].startOnLoop
	}
	b.ReportAllocs()
	b.ResetTimer()
	m := startMeter(b, cl)
	for i := range n {
		h.g.Loops()[i].Post(func() {
			for k := i; k < len(slots); k += n {
				d.start(&slots[k])
			}
		})
	}
	select {
	case <-d.done:
	case <-time.After(time.Duration(b.N)*time.Millisecond + time.Minute):
		b.Fatalf("%d of %d checks finished", d.finished.Load(), b.N)
	}
	b.StopTimer()
	m.report(b)
	b.ReportMetric(float64(d.failed.Load())/float64(b.N), "failed/op")
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "decisions/s")
	d.lat.report(b)
	cst := c.Stats()
	b.ReportMetric(float64(cst.LoopHandoffs)/float64(b.N), "handoffs/op")
	st := cst.Ring
	if st.SendBatches > 0 && st.RecvBatches > 0 {
		b.ReportMetric(float64(st.Sent)/float64(st.SendBatches), "dgrams/sendmmsg")
		b.ReportMetric(float64(st.Received)/float64(st.RecvBatches), "dgrams/recvmmsg")
	}
	h.stop(b)
}

// loopDriver runs BenchmarkRingsLoop256's checks: total in all, left
// not yet started (shared by the loops, as asyncDriver's).
type loopDriver struct {
	c              *Client
	req            *wire.RateRequest
	lat            *latencies
	total          int64
	left, finished atomic.Int64
	failed         atomic.Int64
	done           chan struct{}
}

// loopSlot is one of the 256 checks in flight, on loop l (the
// LoopCompleter).
type loopSlot struct {
	d    *loopDriver
	loop int
	l    *evloop.Loop
	post func() // startOnLoop, bound once
	dec  Decision
	t0   time.Time
}

// start starts the next check on s (on s's loop), if any is left;
// checks decided at once are counted here and the next one started.
func (d *loopDriver) start(s *loopSlot) {
	for d.left.Add(-1) >= 0 {
		s.t0 = time.Now()
		_, decided, err := d.c.CheckAsyncLoop(s.loop, d.req, &s.dec, s)
		if !decided || d.record(s, err) {
			return
		}
	}
}

// record counts one outcome; true once the last one is in.
func (d *loopDriver) record(s *loopSlot, err error) bool {
	if err != nil {
		d.failed.Add(1)
	} else {
		d.lat.add(time.Since(s.t0))
	}
	if d.finished.Add(1) == d.total {
		close(d.done)
		return true
	}
	return false
}

func (s *loopSlot) startOnLoop() { s.d.start(s) }

// CheckDoneOnLoop is the proxy's path: on the loop, start the next check.
func (s *loopSlot) CheckDoneOnLoop(_ *Decision, err error) {
	if !s.d.record(s, err) {
		s.d.start(s)
	}
}

// CheckDone is a check ended off the loop (a deadline): the next one is
// started on the loop, as the proxy would.
func (s *loopSlot) CheckDone(_ *Decision, err error) {
	if !s.d.record(s, err) {
		s.l.Post(s.post)
	}
}
