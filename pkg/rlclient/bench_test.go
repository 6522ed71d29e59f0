package rlclient

import (
	"context"
	"net"
	"runtime"
	"slices"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/rl-tproxy/rl-tproxy/pkg/ratelimitly"
	"github.com/rl-tproxy/rl-tproxy/pkg/ratelimitly/wire"
)

// latencies records per-check durations without allocating.
type latencies struct {
	d []int64
	n atomic.Int64
}

// newLatencies has room for n checks (at most 1<<20 are kept). The array
// is written once here, before the timer starts, so that its page faults
// are not counted in the CPU time of the clients being compared.
func newLatencies(n int) *latencies {
	l := &latencies{d: make([]int64, min(n, 1<<20))}
	for i := range l.d {
		l.d[i] = -1
	}
	return l
}

func (l *latencies) add(d time.Duration) {
	if i := l.n.Add(1) - 1; i < int64(len(l.d)) {
		l.d[i] = int64(d)
	}
}

func (l *latencies) report(b *testing.B) {
	n := min(l.n.Load(), int64(len(l.d)))
	if n == 0 {
		return
	}
	s := slices.Clone(l.d[:n])
	slices.Sort(s)
	b.ReportMetric(float64(s[n/2])/1e3, "p50-µs")
	b.ReportMetric(float64(s[n*99/100])/1e3, "p99-µs")
}

// BenchmarkCheckSerial is one check at a time against a 3-node cluster on
// loopback: latency and allocations per Check.
func BenchmarkCheckSerial(b *testing.B) {
	cl := startCluster(b, 3, nil)
	c := newTestClient(b, cl.dns.Addr(), clientOpts{shards: 1})
	waitReady(b, c)
	req := testRequest()
	var dec Decision
	for i := 0; i < 200; i++ {
		c.Check(context.Background(), req, &dec)
	}
	lat := newLatencies(b.N)
	b.ReportAllocs()
	b.ResetTimer()
	cpu0 := cpuTime()
	for i := 0; i < b.N; i++ {
		t0 := time.Now()
		if err := c.Check(context.Background(), req, &dec); err != nil {
			b.Fatal(err)
		}
		lat.add(time.Since(t0))
	}
	b.StopTimer()
	reportCPU(b, cpu0)
	lat.report(b)
}

// BenchmarkRings256 keeps 256 checks in flight through the batched rings
// against one node (one datagram out, one in per decision).
func BenchmarkRings256(b *testing.B) { benchRings(b, 1) }

// BenchmarkRings256x3 is the same against a 3-node cluster (fan-out).
func BenchmarkRings256x3(b *testing.B) { benchRings(b, 3) }

func benchRings(b *testing.B, nodes int) {
	cl := startBenchCluster(b, nodes)
	c := newTestClient(b, cl.dns.Addr(), clientOpts{shards: runtimeProcs(), policy: ratelimitly.Standard(time.Second)})
	waitReady(b, c)
	var failed atomic.Int64
	lat := newLatencies(b.N)
	b.ReportAllocs()
	b.SetParallelism(256 / runtimeProcs())
	b.ResetTimer()
	m := startMeter(b, cl)
	b.RunParallel(func(pb *testing.PB) {
		req := testRequest()
		var dec Decision
		for pb.Next() {
			t0 := time.Now()
			if err := c.Check(context.Background(), req, &dec); err != nil {
				failed.Add(1) // e.g. a timeout when the shared machine stalls us
				continue
			}
			lat.add(time.Since(t0))
		}
	})
	b.StopTimer()
	m.report(b)
	b.ReportMetric(float64(failed.Load())/float64(b.N), "failed/op")
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "decisions/s")
	lat.report(b)
	cst := c.Stats()
	b.ReportMetric(float64(cst.Replays)/float64(b.N), "replays/op")
	st := cst.Ring
	b.ReportMetric(float64(st.LoopWakes)/float64(b.N), "loopwakes/op")
	b.ReportMetric(float64(st.FlushWakes)/float64(b.N), "flushwakes/op")
	b.ReportMetric(float64(st.Rebinds), "rebinds")
	if st.SendBatches > 0 && st.RecvBatches > 0 {
		b.ReportMetric(float64(st.Sent)/float64(st.SendBatches), "dgrams/sendmmsg")
		b.ReportMetric(float64(st.Received)/float64(st.RecvBatches), "dgrams/recvmmsg")
	}
	if st.Sent > 0 {
		b.ReportMetric(float64(st.GSOSegments)/float64(st.Sent), "gso-share")
	}
}

// BenchmarkRingsAsync256 keeps 256 checks in flight through the rings with
// CheckAsync, as an event loop drives the client: no goroutine waits per
// check; each completion (on the client's receive goroutine) records the
// decision and starts the next check. One node, as Rings256.
func BenchmarkRingsAsync256(b *testing.B) {
	cl := startBenchCluster(b, 1)
	c := newTestClient(b, cl.dns.Addr(), clientOpts{shards: runtimeProcs(), policy: ratelimitly.Standard(time.Second)})
	waitReady(b, c)
	d := &asyncDriver{c: c, req: testRequest(), lat: newLatencies(b.N), total: int64(b.N), done: make(chan struct{})}
	d.left.Store(int64(b.N))
	slots := make([]asyncSlot, 256)
	b.ReportAllocs()
	b.ResetTimer()
	m := startMeter(b, cl)
	for i := range slots {
		slots[i].d = d
		d.start(&slots[i])
	}
	<-d.done
	b.StopTimer()
	m.report(b)
	b.ReportMetric(float64(d.failed.Load())/float64(b.N), "failed/op")
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "decisions/s")
	d.lat.report(b)
	st := c.Stats().Ring
	if st.SendBatches > 0 && st.RecvBatches > 0 {
		b.ReportMetric(float64(st.Sent)/float64(st.SendBatches), "dgrams/sendmmsg")
		b.ReportMetric(float64(st.Received)/float64(st.RecvBatches), "dgrams/recvmmsg")
	}
}

// asyncDriver runs BenchmarkRingsAsync256's checks: total in all, left
// not yet started.
type asyncDriver struct {
	c              *Client
	req            *wire.RateRequest
	lat            *latencies
	total          int64
	left, finished atomic.Int64
	failed         atomic.Int64
	done           chan struct{}
}

// asyncSlot is one of the 256 checks in flight (the Completer).
type asyncSlot struct {
	d   *asyncDriver
	dec Decision
	t0  time.Time
}

// start starts the next check on s, if any is left; checks decided at
// once are counted here and the next one started.
func (d *asyncDriver) start(s *asyncSlot) {
	for d.left.Add(-1) >= 0 {
		s.t0 = time.Now()
		_, decided, err := d.c.CheckAsync(d.req, &s.dec, s)
		if !decided || d.record(s, err) {
			return
		}
	}
}

// record counts one outcome; true once the last one is in.
func (d *asyncDriver) record(s *asyncSlot, err error) bool {
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

func (s *asyncSlot) CheckDone(_ *Decision, err error) {
	if !s.d.record(s, err) {
		s.d.start(s)
	}
}

// BenchmarkNaive256 is the baseline: 256 goroutines, each with its own
// connected UDP socket, one write and one read system call per datagram,
// against one node (the same server as BenchmarkRings256).
func BenchmarkNaive256(b *testing.B) {
	cl := startBenchCluster(b, 1)
	addr := cl.addrs[0]
	cred := testCred()
	key, err := wire.NewKey(cred.KeyID, cred.Secret)
	if err != nil {
		b.Fatal(err)
	}
	var failed atomic.Int64
	lat := newLatencies(b.N)
	b.ReportAllocs()
	b.SetParallelism(256 / runtimeProcs())
	b.ResetTimer()
	m := startMeter(b, cl)
	b.RunParallel(func(pb *testing.PB) {
		conn, err := net.DialUDP("udp4", nil, net.UDPAddrFromAddrPort(addr))
		if err != nil {
			b.Error(err)
			return
		}
		defer conn.Close()
		req := testRequest()
		out := make([]byte, 0, wire.MaxDatagram)
		in := make([]byte, 2048)
		var h, rh wire.Header
		var resp wire.RateResponse
		var id uint64
		for pb.Next() {
			t0 := time.Now()
			id++
			h = wire.Header{TTLms: 3000, RequestID: id<<20 | uint64(time.Now().UnixNano()&0xfffff), Timestamp: uint64(time.Now().UnixMilli())}
			pkt, err := key.Seal(out[:0], &h, req)
			if err != nil {
				b.Error(err)
				return
			}
			if _, err := conn.Write(pkt); err != nil {
				b.Error(err)
				return
			}
			conn.SetReadDeadline(time.Now().Add(3 * time.Second))
			ok := false
			for {
				n, err := conn.Read(in)
				if err != nil {
					break // lost datagram: the naive client has no replay
				}
				if key.OpenBody(in[:n], &rh, &resp) == nil && rh.RequestID == h.RequestID {
					ok = true
					break
				}
			}
			if !ok {
				failed.Add(1)
				continue
			}
			lat.add(time.Since(t0))
		}
	})
	b.StopTimer()
	m.report(b)
	b.ReportMetric(float64(failed.Load())/float64(b.N), "failed/op")
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "decisions/s")
	lat.report(b)
}

func runtimeProcs() int { return runtime.GOMAXPROCS(0) }

// cpuTime is the process's user+system CPU time so far.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// ctxSwitches is the process's voluntary and involuntary context switches
// so far.
func ctxSwitches() int64 {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return ru.Nvcsw + ru.Nivcsw
}

// meter measures the client process (CPU, context switches) and the
// server child (CPU) over a benchmark's timed part.
type meter struct {
	cl       *benchCluster
	cpu, srv time.Duration
	csw      int64
	sys      *syscallCounter
}

func startMeter(b *testing.B, cl *benchCluster) *meter {
	m := &meter{cl: cl, srv: cl.cpu(b), csw: ctxSwitches(), sys: startSyscallCounter()}
	m.cpu = cpuTime()
	return m
}

// report adds cpu-µs/op (the client process alone), srv-cpu-µs/op (the
// server child), ctxsw/op (the client's context switches) and syscalls/op
// (the client's system calls, with RLBENCH_SYSCALLS=1 and perf events).
func (m *meter) report(b *testing.B) {
	sys := m.sys.stop()
	cpu, csw := cpuTime(), ctxSwitches()
	srv := m.cl.cpu(b)
	n := float64(b.N)
	b.ReportMetric(float64(cpu-m.cpu)/n/1e3, "cpu-µs/op")
	b.ReportMetric(float64(srv-m.srv)/n/1e3, "srv-cpu-µs/op")
	b.ReportMetric(float64(csw-m.csw)/n, "ctxsw/op")
	if sys >= 0 {
		b.ReportMetric(float64(sys)/n, "syscalls/op")
	}
}

// reportCPU reports the CPU time (client and in-process servers) per op.
func reportCPU(b *testing.B, start time.Duration) {
	b.ReportMetric(float64(cpuTime()-start)/float64(b.N)/1e3, "cpu-µs/op")
}
