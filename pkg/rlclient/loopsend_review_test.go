package rlclient

import (
	"os/exec"
	"testing"
	"time"

	"github.com/rl-tproxy/rl-tproxy/internal/dnstest"
	"github.com/rl-tproxy/rl-tproxy/internal/netnstest"
	"github.com/rl-tproxy/rl-tproxy/internal/testkit"
	"github.com/rl-tproxy/rl-tproxy/pkg/ratelimitly"
	"github.com/rl-tproxy/rl-tproxy/pkg/ratelimitly/wire"
)

// blockedLoopClient is a client whose one loop shard sends through a
// socket with the minimal send buffer on a tbf-shaped loopback (so its
// turn-end flushes meet a full send buffer), with a manual clock that
// never moves (no replay, no timeout: only flushes send).
func blockedLoopClient(t *testing.T) (*Client, *fakeNode, *loops) {
	t.Helper()
	ns := netnstest.New(t)
	tc := testkit.NeedTool(t, "tc", "iproute2")
	if out, err := exec.Command(tc, "-n", ns.Name, "qdisc", "replace", "dev", "lo", "root",
		"tbf", "rate", "1mbit", "burst", "1600", "limit", "1000000").CombinedOutput(); err != nil {
		testkit.Missing(t, "a tbf qdisc on loopback (kernel sch_tbf): %v: %s", err, out)
	}
	d := dnstest.Start(t)
	var c *Client
	var n *fakeNode
	clk := newManualClock(time.Now())
	if err := ns.Do(func() error {
		n = startFakeNode(t, 1, testCred())
		d.SetSRV(testSRV, targetsFor(n.addr())...)
		c = newTestClient(t, d.Addr(), clientOpts{shards: 1, loops: 1, clock: clk, policy: ratelimitly.SingleRound(10 * time.Second)})
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	waitReady(t, c)
	setSendBuf(t, c.ring.LocalAddr(0), 0)
	return c, n, startLoops(t, c, 1)
}

// TestLoopDetachFlushesBlockedQueue: the loop detaches while its shard
// is blocked (datagrams of pending checks wait in the shard's queue for
// the full send buffer). detach stops the retry timer and forgets
// blocked ("what waits in the queue goes with the shard's next flush"),
// but nothing flushes the released shard: the pending checks' requests
// stay queued until some other datagram is pushed and flushed on that
// shard (in production, the first replay round, a Unit later; here,
// with a clock that does not move, never).
func TestLoopDetachFlushesBlockedQueue(t *testing.T) {
	c, n, h := blockedLoopClient(t)
	const checks = 200
	rec := newLoopRec(checks)
	startLoopChecks(t, h, 0, checks, rec)
	var sentAtDetach uint64
	h.on(t, 0, func() {
		sentAtDetach = c.ring.Stats().Sent
		h.detach[0]()
		h.detach[0] = nil
	})
	if sentAtDetach >= checks || c.ring.Stats().SendBlocked == 0 {
		t.Skipf("the queue drained before the detach (sent %d of %d): nothing to test", sentAtDetach, checks)
	}
	t.Cleanup(func() {
		t.Logf("sent %d of %d at the detach; now sent %d, the node got %d requests", sentAtDetach, checks,
			c.ring.Stats().Sent, n.count(wire.KindRateRequest))
	})
	testkit.WaitWithin(t, 10*time.Second, "every request queued behind the full send buffer to reach the node after the detach",
		func() bool { return n.count(wire.KindRateRequest) == checks })
}

// TestLoopBackoffGrowsPerIdleRetry: the retry backoff is meant to
// pace an idle loop's retries ("Backoff of the flush retries while the
// shard's socket has a full send buffer and the loop has nothing else to
// do"), but flushOwned doubles it at every blocked turn end. A loop busy
// with other work ends many turns while blocked: after 8 of them the
// backoff is at its 10 ms maximum without one idle retry, so when the
// loop then goes idle the datagrams still queued wait 10 ms even though
// the buffer drains at the link's pace (a 300-byte datagram leaves a
// 1 Mbit/s link in 2.4 ms). Eight turn ends are simulated in one loop
// callback, so the retry timer cannot have fired in between.
func TestLoopBackoffGrowsPerIdleRetry(t *testing.T) {
	c, _, h := blockedLoopClient(t)
	ls := c.loops[0]
	rec := newLoopRec(200)
	startLoopChecks(t, h, 0, 200, rec)
	var blocked int
	var backoff, before time.Duration
	h.on(t, 0, func() {
		// Idle retries may have run since the checks went out (each may
		// double the backoff), and one may have fired in this very turn
		// (it doubles at the first turn end below): not the busy ones.
		before = ls.backoff
		for range 8 { // turn ends of a loop busy with other work, the socket still full
			ls.dirty = true
			ls.turnEnd()
			if ls.blocked {
				blocked++
			}
		}
		backoff = ls.backoff
	})
	if blocked < 8 {
		t.Skipf("only %d of 8 turn ends met a full send buffer: nothing to test", blocked)
	}
	if 4*before > sendRetryMax {
		t.Skipf("backoff %v before the busy turn ends: too close to its cap %v to see growth", before, sendRetryMax)
	}
	if limit := max(2*before, 2*sendRetryMin); backoff > limit {
		t.Fatalf("backoff %v after %d blocked turn ends (from %v) with no idle retry among them; want at most %v (the idle loop would wait %v to send what is queued)",
			backoff, blocked, before, limit, backoff)
	}
}
