package rlclient

import (
	"net/netip"
	"os"
	"os/exec"
	"strconv"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/rl-tproxy/rl-tproxy/internal/dnstest"
	"github.com/rl-tproxy/rl-tproxy/internal/netnstest"
	"github.com/rl-tproxy/rl-tproxy/internal/testkit"
	"github.com/rl-tproxy/rl-tproxy/pkg/ratelimitly"
	"github.com/rl-tproxy/rl-tproxy/pkg/ratelimitly/wire"
	"github.com/rl-tproxy/rl-tproxy/pkg/udpshard"
)

// setSendBuf sets SO_SNDBUF of this process's UDP sockets bound to local
// (the client's shard socket; found through /proc/self/fd).
func setSendBuf(t *testing.T, local netip.AddrPort, size int) {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, e := range ents {
		fd, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		sa, err := unix.Getsockname(fd)
		if a, ok := sa.(*unix.SockaddrInet4); err == nil && ok && a.Port == int(local.Port()) && netip.AddrFrom4(a.Addr) == local.Addr() {
			if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_SNDBUF, size); err != nil {
				t.Fatalf("SO_SNDBUF on %v: %v", local, err)
			}
			found = true
		}
	}
	if !found {
		t.Fatalf("no socket bound to %v", local)
	}
}

// TestLoopShardFullSendBuffer: a loop's shard socket with a minimal send
// buffer on a slow link (a network namespace whose loopback is shaped by
// tbf): the checks a turn starts meet a full send buffer, their datagrams
// wait in the shard's queue and leave in later turns (the loop wakes
// itself to retry), and every check is decided on its loop, with one
// request each: none lost (one round, no replay to hide a loss), none
// sent twice.
func TestLoopShardFullSendBuffer(t *testing.T) {
	ns := netnstest.New(t)
	tc := testkit.NeedTool(t, "tc", "iproute2")
	if out, err := exec.Command(tc, "-n", ns.Name, "qdisc", "replace", "dev", "lo", "root",
		"tbf", "rate", "1mbit", "burst", "1600", "limit", "1000000").CombinedOutput(); err != nil {
		testkit.Missing(t, "a tbf qdisc on loopback (kernel sch_tbf): %v: %s", err, out)
	}
	d := dnstest.Start(t) // in the root namespace, where the discovery goroutine looks up
	var c *Client
	var n *fakeNode
	err := ns.Do(func() error { // the shard sockets and the node: on the slow loopback
		n = startFakeNode(t, 1, testCred())
		d.SetSRV(testSRV, targetsFor(n.addr())...)
		c = newTestClient(t, d.Addr(), clientOpts{shards: 1, loops: 1, policy: ratelimitly.SingleRound(10 * time.Second)})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	waitReady(t, c)
	setSendBuf(t, c.ring.LocalAddr(0), 0) // the kernel's minimum
	h := startLoops(t, c, 1)
	const checks = 200
	rec := newLoopRec(checks)
	startLoopChecks(t, h, 0, checks, rec)
	for range checks {
		if got := rec.next(t); !got.onLoop || got.gid != h.gids[0] || !got.cause.Decided() {
			t.Fatalf("check: %+v, want decided on the loop", got)
		}
	}
	st := c.Stats()
	if st.Ring.SendBlocked == 0 {
		t.Fatal("no flush met a full send buffer: the test did not test it")
	}
	if st.Ring.Dropped != (udpshard.DropCounts{}) || st.Replays != 0 || st.LoopHandoffs != 0 {
		t.Fatalf("drops %+v, replays %d, hand-offs %d; want none", st.Ring.Dropped, st.Replays, st.LoopHandoffs)
	}
	if got := n.count(wire.KindRateRequest); got != checks {
		t.Fatalf("the node got %d requests for %d checks", got, checks)
	}
	t.Logf("%d flushes met a full send buffer; %d datagrams waited for a later one", st.Ring.SendBlocked, st.Ring.Requeued)
}
