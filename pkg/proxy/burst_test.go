package proxy

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// barrierHook holds every Admit until n requests are waiting at once (a
// RateLimitly outage seen from the proxy), then denies them all.
type barrierHook struct {
	n       int64
	waiting atomic.Int64
	all     chan struct{}
}

func (h *barrierHook) Admit(ctx context.Context, _ *Request) Decision {
	if h.waiting.Add(1) == h.n {
		close(h.all)
	}
	select {
	case <-h.all:
	case <-ctx.Done():
	case <-time.After(2 * time.Minute): // a bound, not a measurement
	}
	return Decision{Status: 429}
}

func (h *barrierHook) Done(*Request, *Decision, *Result) {}

// After a burst of 3,000 concurrent requests, the goroutines the burst
// needed (a connection goroutine and a client-abort watcher each) go away
// again: the count comes back within 10 % of the baseline (issue 13).
func TestBurstGoroutinesReturnToBaseline(t *testing.T) {
	goroutinePathOnly(t)
	const n = 3000
	hook := &barrierHook{n: n, all: make(chan struct{})}
	p, addr := startProxy(t, hook, &Service{Upstream: "127.0.0.1:9"}, func(cfg *Config) {
		cfg.ParkIdleAfter = -1                  // no parker goroutines in the count
		cfg.watcherIdle = 50 * time.Millisecond // DefaultWatcherIdleTimeout is 10s
	})
	runtime.GC()
	base := runtime.NumGoroutine()
	rssBase := rssKiB()

	conns := make([]net.Conn, 0, n)
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	for i := 0; i < n; i++ {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatalf("dial %d: %v", i, err)
		}
		c.SetDeadline(time.Now().Add(3 * time.Minute))
		conns = append(conns, c)
		if _, err := fmt.Fprintf(c, "GET /%d HTTP/1.1\r\nHost: x\r\n\r\n", i); err != nil {
			t.Fatal(err)
		}
	}
	peak := runtime.NumGoroutine()
	rssPeak := rssKiB()
	for i, c := range conns {
		r, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil || r.StatusCode != 429 {
			t.Fatalf("response %d: %v %v", i, r, err)
		}
		c.Close()
	}
	conns = conns[:0]
	p.watchers.mu.Lock()
	started := p.watchers.started
	p.watchers.mu.Unlock()
	if started < n {
		t.Fatalf("%d watchers started for %d concurrent admissions: the burst was not concurrent", started, n)
	}

	bound := base + max(1, base/10)
	var got int
	for i := 0; i < 6000; i++ { // up to a minute
		if got = runtime.NumGoroutine(); got <= bound && p.Stats().Watchers == 0 && p.trim.count.Load() == 1 {
			break
		}
		time.Sleep(10 * time.Millisecond) // polling an observable count, with a bound
	}
	if got > bound || p.Stats().Watchers != 0 || p.trim.count.Load() != 1 {
		buf := make([]byte, 1<<16)
		t.Fatalf("goroutines %d (baseline %d, bound %d), watchers %d, memory trims %d (want 1)\n%s", got, base, bound,
			p.Stats().Watchers, p.trim.count.Load(), buf[:runtime.Stack(buf, true)])
	}
	// No GC forced here: the proxy ran its trim when the burst ended.
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	t.Logf("heap inuse %d KiB, stack inuse %d KiB, sys %d KiB, released %d KiB, other %d KiB, gcsys %d KiB", ms.HeapInuse>>10, ms.StackInuse>>10, ms.Sys>>10, ms.HeapReleased>>10, ms.OtherSys>>10, ms.GCSys>>10)
	t.Logf("goroutines: baseline %d, burst %d, after %d; RSS KiB: baseline %d, burst %d, after %d",
		base, peak, got, rssBase, rssPeak, rssKiB())
}

// rssKiB is the process's resident set (VmRSS), 0 when unknown.
func rssKiB() int {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "VmRSS:"); ok {
			var kb int
			fmt.Sscan(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), &kb)
			return kb
		}
	}
	return 0
}

// The idle sweep that ends a burst's watchers after its connections are
// gone reaches the memory trim, which takes the proxy's lock and then the
// watchers' lock: the sweep must not hold its own lock meanwhile (it did,
// and the first such sweep hung the proxy).
func TestWatcherSweepAfterBurstTrims(t *testing.T) {
	goroutinePathOnly(t)
	const n = trimAfterBurst + 44
	hook := &barrierHook{n: n, all: make(chan struct{})}
	p, addr := startProxy(t, hook, &Service{Upstream: "127.0.0.1:9"}, func(cfg *Config) {
		cfg.ParkIdleAfter = -1
		cfg.watcherIdle = time.Hour // the test sweeps by hand
	})
	conns := make([]net.Conn, 0, n)
	for i := 0; i < n; i++ {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		c.SetDeadline(time.Now().Add(time.Minute))
		conns = append(conns, c)
		fmt.Fprintf(c, "GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
	}
	for i, c := range conns {
		if r, err := http.ReadResponse(bufio.NewReader(c), nil); err != nil || r.StatusCode != 429 {
			t.Fatalf("response %d: %v %v", i, r, err)
		}
		c.Close()
	}
	for i := 0; p.Stats().Conns != 0; i++ {
		if i == 6000 {
			t.Fatalf("connections still open: %+v", p.Stats())
		}
		time.Sleep(10 * time.Millisecond) // polling an observable count, with a bound
	}
	if p.trim.count.Load() != 0 {
		t.Fatal("trimmed while the watchers were alive")
	}
	p.watchers.mu.Lock()
	p.watchers.idleTimeout = 0 // every idle watcher is due
	p.watchers.mu.Unlock()
	done := make(chan struct{})
	go func() { p.watchers.sweep(); close(done) }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("the sweep deadlocked")
	}
	for i := 0; p.trim.count.Load() != 1 || p.Stats().Watchers != 0; i++ {
		if i == 6000 {
			t.Fatalf("trims %d, watchers %d after the sweep", p.trim.count.Load(), p.Stats().Watchers)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
