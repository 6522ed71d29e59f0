package rlclient

import (
	"bufio"
	"context"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rl-tproxy/rl-tproxy/internal/testkit"
	"github.com/rl-tproxy/rl-tproxy/pkg/ratelimitly"
	"github.com/rl-tproxy/rl-tproxy/pkg/ratelimitly/wire"
	"github.com/rl-tproxy/rl-tproxy/pkg/udpshard"
)

// gatedClient starts a client whose socket readers are held back until
// the returned release is called (also at cleanup), as in a process that
// is stalled or whose readers wait for a CPU while answers queue up in the
// kernel.
func gatedClient(t *testing.T, dnsAddr string, o clientOpts) (*Client, func()) {
	t.Helper()
	gate := make(chan struct{})
	testReadGate = func(*udpshard.Socket) { <-gate }
	c := newTestClient(t, dnsAddr, o)
	testReadGate = nil
	var once sync.Once
	release := func() { once.Do(func() { close(gate) }) }
	t.Cleanup(release) // runs before the client's Close (LIFO)
	return c, release
}

// udpRxQueue is the receive queue (bytes) of the UDP socket bound to
// local, from /proc/net/udp (IPv4 sockets).
func udpRxQueue(t testing.TB, local netip.AddrPort) int {
	t.Helper()
	f, err := os.Open("/proc/net/udp")
	if err != nil {
		testkit.Missing(t, "needs /proc/net/udp: %v", err)
	}
	defer f.Close()
	a := local.Addr().As4()
	want := fmt.Sprintf("%02X%02X%02X%02X:%04X", a[3], a[2], a[1], a[0], local.Port())
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fs := strings.Fields(sc.Text())
		if len(fs) < 5 || fs[1] != want {
			continue
		}
		_, rx, ok := strings.Cut(fs[4], ":")
		if !ok {
			continue
		}
		n, err := strconv.ParseUint(rx, 16, 32)
		if err != nil {
			t.Fatalf("parse rx_queue %q: %v", fs[4], err)
		}
		return int(n)
	}
	t.Fatalf("socket %s not in /proc/net/udp", local)
	return 0
}

// TestStalledReadersAnswersBeatOverdueDeadlines is the regression test for
// timeouts seen under load (test/fault abort workload) although every
// server answered in time: after a stall the shard's timer goroutine ran
// the overdue round ends (replay, final receive, timeout) before the
// reader goroutine had taken the answers out of the socket. The timer now
// drains the shard's sockets before acting on a due deadline.
func TestStalledReadersAnswersBeatOverdueDeadlines(t *testing.T) {
	d, nodes := fakeCluster(t, 3)
	clk := newManualClock(time.Now())
	u := 100 * time.Millisecond
	c, release := gatedClient(t, d.Addr(), clientOpts{clock: clk, policy: ratelimitly.Standard(u), shards: 1})
	waitReady(t, c)
	ch := checkAsync(context.Background(), c, testRequest())
	testkit.WaitFor(t, "requests sent", func() bool { return allCount(nodes, wire.KindRateRequest) == 3 })
	// The answers are in the kernel's queue of the client socket; its
	// reader is held back, so nothing has been delivered.
	local := c.ring.LocalAddr(0)
	testkit.WaitFor(t, "answers queued on the client socket", func() bool { return udpRxQueue(t, local) > 0 })
	assertPending(t, ch, "readers held back")
	if st := c.Stats(); st.Ring.Received != 0 {
		t.Fatalf("reader delivered %d datagrams while held back", st.Ring.Received)
	}
	// The process "wakes up" past the whole horizon at once.
	clk.Advance(c.Horizon())
	r := await(t, ch)
	release()
	if r.err != nil || !r.d.Cause.Decided() {
		t.Fatalf("answers queued before the deadline were ignored: err %v cause %v attempts %d", r.err, r.d.Cause, r.d.Attempts)
	}
	if r.d.Attempts != 1 {
		t.Errorf("attempts = %d, want 1 (the queued answers decide at the first round end, no replay)", r.d.Attempts)
	}
	if st := c.Stats(); st.Causes[CauseTimeout] != 0 || st.Replays != 0 {
		t.Errorf("timeouts %d replays %d, want none", st.Causes[CauseTimeout], st.Replays)
	}
}

// TestRandomCancellationsNeverTimeOutOthers runs many concurrent checks
// against always-answering nodes and cancels a random share of them at
// random points (before the call, while sending, while waiting). The
// clock never moves, so a check can only end by a decision or its own
// cancellation: a cancelled check that retired, corrupted or recycled the
// state of another in-flight check would leave that check hanging (or
// ending with a wrong cause) and fail the test.
func TestRandomCancellationsNeverTimeOutOthers(t *testing.T) {
	d, _ := fakeCluster(t, 3)
	clk := newManualClock(time.Now())
	c := newTestClient(t, d.Addr(), clientOpts{clock: clk, policy: ratelimitly.Standard(100 * time.Millisecond), shards: 2})
	waitReady(t, c)
	const workers, perWorker = 8, 150
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		failures []string
		decided  int
		canceled int
	)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 7))
			req := testRequest()
			var dec Decision
			for i := range perWorker {
				ctx, cancel := context.WithCancel(context.Background())
				var cdone chan struct{}
				switch mode := rng.IntN(4); mode {
				case 0: // cancelled before the call
					cancel()
				case 1: // cancelled concurrently, at a random point of the call
					cdone = make(chan struct{})
					go func() { defer close(cdone); cancel() }()
				}
				err := c.Check(ctx, req, &dec)
				if cdone != nil {
					<-cdone
				}
				cancelled := ctx.Err() != nil
				cancel()
				mu.Lock()
				switch {
				case dec.Cause.Decided() && err == nil:
					decided++
				case dec.Cause == CauseCancelled && err == ErrCancelled && cancelled:
					canceled++
				default:
					failures = append(failures, fmt.Sprintf("worker %d check %d: cause %v err %v (cancelled %v)", w, i, dec.Cause, err, cancelled))
				}
				mu.Unlock()
			}
		}()
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(60 * time.Second):
		// A lost check never ends on a frozen clock: let the horizon pass
		// so it surfaces with its cause, then report.
		for range 4 {
			clk.Advance(c.Horizon())
		}
		<-done
		t.Error("checks did not finish on a frozen clock")
	}
	for _, f := range failures {
		t.Error(f)
	}
	st := c.Stats()
	if st.Causes[CauseTimeout] != 0 || st.InFlight != 0 {
		t.Errorf("timeouts %d in flight %d", st.Causes[CauseTimeout], st.InFlight)
	}
	if decided == 0 || canceled == 0 {
		t.Errorf("decided %d cancelled %d: the workload must exercise both", decided, canceled)
	}
	t.Logf("decided %d, cancelled %d, replays %d, late answers %d", decided, canceled, st.Replays, st.Drops.UnknownID)
}
