package evloop

import (
	"fmt"
	"sync"
	"testing"

	"golang.org/x/sys/unix"
)

// cpuNanos is the process's user + system CPU time.
func cpuNanos() int64 {
	var ru unix.Rusage
	unix.Getrusage(unix.RUSAGE_SELF, &ru)
	return ru.Utime.Nano() + ru.Stime.Nano()
}

// threadNanos is the calling thread's CPU time (a loop's, when run on it:
// loops are locked to their threads).
func threadNanos() int64 {
	var ts unix.Timespec
	unix.ClockGettime(unix.CLOCK_THREAD_CPUTIME_ID, &ts)
	return ts.Nano()
}

// BenchmarkEcho: 512-byte echo round trips through one loop, by backend
// and number of concurrent connections (each a blocking raw-syscall
// client goroutine, so the client's CPU is in cpu-ns/op too). Reported
// beside ns/op: cpu-ns/op (process CPU per round trip), loop-cpu-ns/op
// (the loop thread's CPU per round trip: the server side alone) and
// turns/op (loop turns per round trip; with io_uring one io_uring_enter
// each).
func BenchmarkEcho(b *testing.B) {
	for _, be := range []Backend{Epoll, IOUring} {
		for _, conns := range []int{1, 64} {
			b.Run(fmt.Sprintf("%s/conns=%d", be, conns), func(b *testing.B) {
				if be == IOUring {
					if err := probeUring(); err != nil {
						b.Skipf("io_uring refused: %v", err)
					}
				}
				benchEcho(b, be, conns)
			})
		}
	}
}

func benchEcho(b *testing.B, be Backend, conns int) {
	g := startGroup(b, be, 1)
	addr, _ := accepted(b, g, func() Handler { return &echo{} })
	fds := make([]int, conns)
	for i := range fds {
		fds[i] = rawClient(b, addr)
	}
	waitStats(b, g, "clients accepted", func(s Stats) bool { return s.Sockets == conns })
	msg := make([]byte, 512)
	per := b.N / conns
	b.SetBytes(int64(len(msg)))
	b.ReportAllocs()
	l := g.Loops()[0]
	var loop0, loop1 int64
	on(l, func() { loop0 = threadNanos() })
	turns0, cpu0 := g.Stats().Turns, cpuNanos()
	b.ResetTimer()
	var wg sync.WaitGroup
	for _, fd := range fds {
		wg.Add(1)
		go func() {
			defer wg.Done()
			got := make([]byte, len(msg))
			for i := 0; i < per; i++ {
				if _, err := unix.Write(fd, msg); err != nil {
					b.Error(err)
					return
				}
				for n := 0; n < len(msg); {
					k, err := unix.Read(fd, got[n:])
					if err != nil || k == 0 {
						b.Errorf("read: %d, %v", k, err)
						return
					}
					n += k
				}
			}
		}()
	}
	wg.Wait()
	b.StopTimer()
	ops := float64(max(per*conns, 1))
	b.ReportMetric(float64(cpuNanos()-cpu0)/ops, "cpu-ns/op")
	on(l, func() { loop1 = threadNanos() })
	b.ReportMetric(float64(loop1-loop0)/ops, "loop-cpu-ns/op")
	b.ReportMetric(float64(g.Stats().Turns-turns0)/ops, "turns/op")
}
