package hook

import (
	"context"
	"crypto/rand"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"syscall"
	"testing"
	"time"

	"github.com/rl-tproxy/rl-tproxy/internal/testkit"
	"github.com/rl-tproxy/rl-tproxy/pkg/admission"
	"github.com/rl-tproxy/rl-tproxy/pkg/embedded"
	"github.com/rl-tproxy/rl-tproxy/pkg/evloop"
	"github.com/rl-tproxy/rl-tproxy/pkg/exchange"
	"github.com/rl-tproxy/rl-tproxy/pkg/httpparse"
	"github.com/rl-tproxy/rl-tproxy/pkg/ratelimitly"
	"github.com/rl-tproxy/rl-tproxy/pkg/ratelimitly/credentials"
	"github.com/rl-tproxy/rl-tproxy/pkg/rlclient"
)

// BenchmarkAdmitEmbedded measures one whole admission (render, encode,
// seal, UDP round trip to an embedded rlserver on loopback, open, decode,
// allow contract) plus Done with its latency report, through Admit (a
// blocking caller: HTTP/2, the loops' admission workers) and through Begin (the event-loop
// path: the check completes on the client's receive goroutine, which
// resumes the caller). cpu-µs/op and ctxsw/op are the process's CPU time
// (client, server and gate) and context switches per admission.
func BenchmarkAdmitEmbedded(b *testing.B) {
	for _, via := range []string{"admit", "begin"} {
		b.Run(via, func(b *testing.B) {
			g, r := embeddedGate(b, "1000000000/s")
			res := &exchange.Result{Status: 200}
			w := &chanResumer{ch: make(chan struct{}, 1)}
			ctx := context.Background()
			admit := func() exchange.Decision { return g.Admit(ctx, r) }
			if via == "begin" {
				d := new(exchange.Decision) // the proxy's, per connection
				admit = func() exchange.Decision {
					if !g.Begin(r, d, w) {
						<-w.ch
					}
					return *d
				}
			}
			b.ReportAllocs()
			u0 := getUsage()
			b.ResetTimer()
			for b.Loop() {
				r.Start = time.Now()
				res.End = r.Start.Add(time.Millisecond) // fast responses: the guard stays open
				d := admit()
				if !d.Allow {
					st := d.State.(*state)
					b.Fatalf("denied: status %d cause %v", d.Status, st.dec.Cause)
				}
				g.Done(r, &d, res)
			}
			b.StopTimer()
			u0.report(b)
		})
	}
}

// chanResumer is a Resumer that signals a channel (a loop would queue
// the connection).
type chanResumer struct{ ch chan struct{} }

func (c *chanResumer) Resume() { c.ch <- struct{}{} }

// usage is the process's CPU time and context switches so far.
type usage struct {
	cpu   time.Duration
	ctxsw int64
}

func getUsage() usage {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return usage{}
	}
	return usage{time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), ru.Nvcsw + ru.Nivcsw}
}

// report reports the CPU time (client, server and gate) and the context
// switches (voluntary and not: the thread hand-offs) per op since u0.
func (u0 usage) report(b *testing.B) {
	u := getUsage()
	b.ReportMetric(float64(u.cpu-u0.cpu)/float64(b.N)/1e3, "cpu-µs/op")
	b.ReportMetric(float64(u.ctxsw-u0.ctxsw)/float64(b.N), "ctxsw/op")
}

// embeddedGate is a quiet Gate whose checker is an rlclient Client of an
// embedded RateLimitly, with one location limited at rate and guarded,
// and a request for it.
func embeddedGate(tb testing.TB, rate string) (*Gate, *exchange.Request) {
	tb.Helper()
	g, r, _ := embeddedGateLoops(tb, rate, 0)
	return g, r
}

// embeddedGateLoops is embeddedGate with a client that has loops loop
// shards (rlclient Config.LoopShards); it returns the client too.
func embeddedGateLoops(tb testing.TB, rate string, loops int) (*Gate, *exchange.Request, *rlclient.Client) {
	tb.Helper()
	var c credentials.Credential
	c.Tenant, c.KeyID = "bench", 1
	if _, err := rand.Read(c.Secret[:]); err != nil {
		tb.Fatal(err)
	}
	e, err := embedded.Start(embedded.Config{Credentials: []credentials.Credential{c}})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { e.Close() })
	cl, err := rlclient.New(rlclient.Config{SRV: e.SRV, Resolver: e.Resolver, Credential: c, Policy: ratelimitly.Standard(20 * time.Millisecond),
		LoopShards: loops})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { cl.Close() })
	testkit.WaitFor(tb, "discovery", cl.Ready)
	path := filepath.Join(tb.TempDir(), "policy.yaml")
	pol := `ratelimitly:
  embedded: true
zones:
  z: {bucket: "k:{header.x-key}", rate: ` + rate + `}
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
		tb.Fatal(err)
	}
	p, err := admission.Load(path)
	if err != nil {
		tb.Fatal(err)
	}
	g, r := quietGate(tb, "close", allowAll)
	g.Swap(p)
	g.SetChecker(NewClient(cl), nil)
	var head httpparse.Request
	if err := head.Parse([]byte("GET /x HTTP/1.1\r\nHost: example.com\r\nX-Key: alice\r\n\r\n"), httpparse.Limits{}); err != nil {
		tb.Fatal(err)
	}
	r.Head, r.Path, r.Local = &head, []byte("/x"), netip.MustParseAddrPort("127.0.0.1:1")
	r.Service = &exchange.Service{Name: "web"}
	return g, r, cl
}

// BenchmarkAdmitEmbedded64 keeps 64 admissions in flight: through Admit,
// 64 goroutines each blocked on its check (blocking callers); through
// Begin, one goroutine that starts 64 checks and handles each Resume as
// it comes (what one event loop does).
func BenchmarkAdmitEmbedded64(b *testing.B) {
	const inflight = 64
	b.Run("admit", func(b *testing.B) {
		g, r := embeddedGate(b, "1000000000/s")
		b.SetParallelism(inflight / runtime.GOMAXPROCS(0))
		b.ReportAllocs()
		u0 := getUsage()
		b.ResetTimer()
		b.RunParallel(func(pb *testing.PB) {
			rr := *r
			res := &exchange.Result{Status: 200}
			ctx := context.Background()
			for pb.Next() {
				rr.Start = time.Now()
				res.End = rr.Start.Add(time.Millisecond)
				d := g.Admit(ctx, &rr)
				if !d.Allow {
					b.Error("denied")
				}
				g.Done(&rr, &d, res)
			}
		})
		b.StopTimer()
		u0.report(b)
	})
	b.Run("begin", func(b *testing.B) {
		g, r := embeddedGate(b, "1000000000/s")
		ready := make(chan int, inflight)
		slots := make([]benchSlot, inflight)
		for i := range slots {
			slots[i] = benchSlot{r: *r, res: exchange.Result{Status: 200}, w: slotResumer{i, ready}}
		}
		start := func(i int) {
			s := &slots[i]
			s.r.Start = time.Now()
			if g.Begin(&s.r, &s.d, &s.w) {
				ready <- i
			}
		}
		b.ReportAllocs()
		u0 := getUsage()
		b.ResetTimer()
		started := 0
		for i := range min(inflight, b.N) {
			start(i)
			started++
		}
		for done := 0; done < b.N; done++ {
			i := <-ready
			s := &slots[i]
			if !s.d.Allow {
				b.Fatal("denied")
			}
			s.res.End = s.r.Start.Add(time.Millisecond)
			g.Done(&s.r, &s.d, &s.res)
			if started < b.N {
				start(i)
				started++
			}
		}
		b.StopTimer()
		u0.report(b)
	})
}

// BenchmarkAdmitEmbedded64Loop is the Begin side of
// BenchmarkAdmitEmbedded64 on a real event loop: Begin and Done run on
// the loop's thread (Request.Loop) and Resume Posts the request back to
// it, as the loop path of pkg/proxy does.
func BenchmarkAdmitEmbedded64Loop(b *testing.B) {
	const inflight = 64
	g, r := embeddedGate(b, "1000000000/s")
	grp, err := evloop.Start(evloop.Config{Loops: 1, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		b.Fatal(err)
	}
	defer grp.Close()
	l := grp.Loops()[0]
	d := &loopBench{g: g, n: b.N, done: make(chan struct{})}
	d.slots = make([]loopSlot, inflight)
	for i := range d.slots {
		s := &d.slots[i]
		s.r, s.b, s.l = *r, d, l
		s.r.Loop = l
		s.resumed = s.onLoop
	}
	cl := g.checker.Load().c.(*Client).C
	st0 := cl.Stats().Ring
	b.ReportAllocs()
	u0 := getUsage()
	b.ResetTimer()
	l.Post(func() {
		for i := range d.slots {
			if d.started < d.n {
				d.start(&d.slots[i])
			}
		}
	})
	<-d.done
	b.StopTimer()
	u0.report(b)
	st := cl.Stats().Ring
	if n := st.SendBatches - st0.SendBatches; n > 0 {
		b.ReportMetric(float64(st.Sent-st0.Sent)/float64(n), "dgrams/sendmmsg")
	}
	if d.denied > 0 {
		b.Fatalf("%d denied", d.denied)
	}
}

// loopBench is the loop-thread state of BenchmarkAdmitEmbedded64Loop.
type loopBench struct {
	g                         *Gate
	slots                     []loopSlot
	n, started, ended, denied int
	done                      chan struct{}
}

type loopSlot struct {
	l       *evloop.Loop
	r       exchange.Request
	d       exchange.Decision
	res     exchange.Result
	b       *loopBench
	resumed func()
}

func (s *loopSlot) Resume() { s.l.Post(s.resumed) }

func (b *loopBench) start(s *loopSlot) {
	b.started++
	s.r.Start = time.Now()
	if b.g.Begin(&s.r, &s.d, s) {
		s.onLoop()
	}
}

// onLoop ends s's request on the loop thread and starts the next.
func (s *loopSlot) onLoop() {
	b := s.b
	if !s.d.Allow {
		b.denied++
	}
	s.res.End = s.r.Start.Add(time.Millisecond)
	b.g.Done(&s.r, &s.d, &s.res)
	b.ended++
	if b.ended == b.n {
		close(b.done)
		return
	}
	if b.started < b.n {
		b.start(s)
	}
}

// benchSlot is one connection's admission state in the Begin benchmark.
type benchSlot struct {
	r   exchange.Request
	d   exchange.Decision
	res exchange.Result
	w   slotResumer
}

// slotResumer queues its slot, as a loop queues a resumed connection.
type slotResumer struct {
	i     int
	ready chan int
}

func (s *slotResumer) Resume() { s.ready <- s.i }
