package rlclient

import (
	"bytes"
	"context"
	"log/slog"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rl-tproxy/rl-tproxy/internal/dnstest"
	"github.com/rl-tproxy/rl-tproxy/internal/testkit"
	"github.com/rl-tproxy/rl-tproxy/pkg/ratelimitly"
	"github.com/rl-tproxy/rl-tproxy/pkg/ratelimitly/wire"
)

// learnAll runs checks until every endpoint's epoch is known.
func learnAll(t *testing.T, c *Client, nodes []*fakeNode, checks int) {
	t.Helper()
	var dec Decision
	for i := 0; i < checks; i++ {
		if err := c.Check(context.Background(), testRequest(), &dec); err != nil {
			t.Fatalf("learning check %d: %v", i, err)
		}
	}
	testkit.WaitFor(t, "epochs", func() bool {
		for _, e := range c.disc.current().eps {
			if e.epoch.Load() == 0 {
				return false
			}
		}
		return true
	})
	testkit.WaitFor(t, "learning traffic", func() bool { return allCount(nodes, wire.KindRateRequest) == checks*len(nodes) })
}

func probes(n *fakeNode) int {
	k := 0
	for _, s := range n.received() {
		if s.kind == wire.KindRateRequest && s.probe {
			k++
		}
	}
	return k
}

// TestDeadOldestLeavesUsableSetAndRejoins: the oldest endpoint stops
// answering. Checks wait for it until U (decided at the deadline) for
// MissLimit requests; once the first of them is a horizon old it leaves
// the usable set: checks are decided on the answers (none waits for a
// deadline: the manual clock does not move) and nothing is sent to it but
// probes. Its first valid answer to a probe brings it back, and being the
// oldest it decides again.
func TestDeadOldestLeavesUsableSetAndRejoins(t *testing.T) {
	d, nodes := fakeCluster(t, 3)
	clk := newManualClock(time.Now())
	u := 20 * time.Millisecond
	c := newTestClient(t, d.Addr(), clientOpts{clock: clk, policy: ratelimitly.Standard(u)})
	waitReady(t, c)
	learnAll(t, c, nodes, 5)
	nodes[0].set(func(n *fakeNode) { n.drop = true })
	atUnit := c.Stats().DecidedAtUnit
	for i := 0; i < MissLimit; i++ {
		ch := checkAsync(context.Background(), c, testRequest())
		waitValid(t, c, 2)
		assertPending(t, ch, "the oldest is still usable")
		clk.Advance(u)
		if r := await(t, ch); r.err != nil || r.d.ServerEpoch != 2000 {
			t.Fatalf("check %d: err %v decision %+v", i, r.err, r.d)
		}
	}
	if st := c.Stats(); st.DecidedAtUnit != atUnit+MissLimit {
		t.Fatalf("decided at unit %d, want %d", st.DecidedAtUnit, atUnit+MissLimit)
	}
	clk.Advance(c.Horizon()) // the first missed request is now a horizon old
	if st := c.Stats(); st.Usable != 2 {
		t.Fatalf("usable %d, want 2", st.Usable)
	}
	sentDead := nodes[0].count(wire.KindRateRequest)
	st0 := c.Stats()
	var dec Decision
	for i := 0; i < 20; i++ { // the clock stands still: no deadline can decide these
		if err := c.Check(context.Background(), testRequest(), &dec); err != nil || dec.ServerEpoch != 2000 {
			t.Fatalf("check %d after the node left: err %v decision %+v", i, err, dec)
		}
	}
	st := c.Stats()
	if st.DecidedAtUnit != st0.DecidedAtUnit || st.DecidedEarly != st0.DecidedEarly+20 {
		t.Errorf("decided at unit %d -> %d, early %d -> %d", st0.DecidedAtUnit, st.DecidedAtUnit, st0.DecidedEarly, st.DecidedEarly)
	}
	if got := nodes[0].count(wire.KindRateRequest); got != sentDead {
		t.Errorf("the unusable node got %d requests", got-sentDead)
	}
	// The live nodes' answers to those checks may still be on their way
	// (the checks were decided on the oldest usable answer): let them
	// arrive before the clock moves, or they would count as misses.
	testkit.WaitFor(t, "late answers of the live nodes", func() bool {
		eps := c.disc.current().eps
		return eps[1].health.pending.Load() == 0 && eps[2].health.pending.Load() == 0
	})
	// Probed while dead: still unusable.
	clk.Advance(ProbeInterval)
	testkit.WaitFor(t, "first probe", func() bool { return probes(nodes[0]) == 1 })
	if probes(nodes[1])+probes(nodes[2]) != 0 {
		t.Error("usable endpoints were probed")
	}
	// Back: the next probe's valid answer makes it usable, and it is the
	// oldest again.
	nodes[0].set(func(n *fakeNode) { n.drop = false })
	clk.Advance(ProbeInterval)
	testkit.WaitFor(t, "probe answer", func() bool { return c.Stats().ProbeAnswers == 1 })
	if st := c.Stats(); st.Usable != 3 {
		t.Fatalf("usable %d after the probe answer", st.Usable)
	}
	if err := c.Check(context.Background(), testRequest(), &dec); err != nil || dec.ServerEpoch != 1000 || dec.Endpoint != "n1.rl.test." {
		t.Fatalf("after rejoining: err %v decision %+v, want the oldest (n1)", err, dec)
	}
}

// TestAllUnusableStillSends: with every endpoint out of the usable set, a
// check still goes to all of them.
func TestAllUnusableStillSends(t *testing.T) {
	d, nodes := fakeCluster(t, 3)
	for _, n := range nodes {
		n.set(func(n *fakeNode) { n.drop = true })
	}
	clk := newManualClock(time.Now())
	u := 20 * time.Millisecond
	c := newTestClient(t, d.Addr(), clientOpts{clock: clk, policy: ratelimitly.Standard(u)})
	waitReady(t, c)
	for i := 0; i < MissLimit; i++ {
		ch := checkAsync(context.Background(), c, testRequest())
		testkit.WaitFor(t, "round", func() bool { return allCount(nodes, wire.KindRateRequest) == 3*(2*i+1) })
		clk.Advance(u)
		testkit.WaitFor(t, "replay", func() bool { return allCount(nodes, wire.KindRateRequest) == 3*(2*i+2) })
		clk.Advance(2 * u)
		if r := await(t, ch); r.err != ErrTimeout {
			t.Fatalf("check %d: %v", i, r.err)
		}
	}
	if st := c.Stats(); st.Usable != 0 {
		t.Fatalf("usable %d, want 0", st.Usable)
	}
	before := allCount(nodes, wire.KindRateRequest)
	ch := checkAsync(context.Background(), c, testRequest())
	testkit.WaitFor(t, "send to every endpoint", func() bool { return allCount(nodes, wire.KindRateRequest) >= before+3 })
	nodes[1].set(func(n *fakeNode) { n.drop = false })
	clk.Advance(u) // the replay reaches the node that came back
	if r := await(t, ch); r.err != nil || r.d.Endpoint != "n2.rl.test." {
		t.Fatalf("err %v decision %+v", r.err, r.d)
	}
}

// TestEveryAddressOfATargetIsAnEndpoint: a target with two A records and
// one AAAA record is three endpoints, and each receives every request.
func TestEveryAddressOfATargetIsAnEndpoint(t *testing.T) {
	var nodes []*fakeNode
	for try := 0; try < 20 && nodes == nil; try++ {
		first := startFakeNode(t, 1000, testCred())
		port := first.addr().Port()
		a2, err2 := startFakeNodeAt(t, netip.AddrPortFrom(netip.MustParseAddr("127.0.0.2"), port), 2000, testCred())
		a6, err6 := startFakeNodeAt(t, netip.AddrPortFrom(netip.IPv6Loopback(), port), 3000, testCred())
		if err2 == nil && err6 == nil {
			nodes = []*fakeNode{first, a2, a6}
		}
	}
	if nodes == nil {
		t.Fatal("could not listen on 127.0.0.1, 127.0.0.2 and [::1] with one port")
	}
	d := dnstest.Start(t)
	d.SetSRV(testSRV, dnstest.Target{Name: "multi.rl.test", Port: nodes[0].addr().Port(),
		Addrs: []netip.Addr{netip.MustParseAddr("127.0.0.1"), netip.MustParseAddr("127.0.0.2"), netip.IPv6Loopback()}})
	c := newTestClient(t, d.Addr(), clientOpts{anyBind: true})
	waitReady(t, c)
	if eps := c.Endpoints(); len(eps) != 3 {
		t.Fatalf("endpoints %+v, want 3", eps)
	}
	var dec Decision
	for i := 1; i <= 5; i++ {
		if err := c.Check(context.Background(), testRequest(), &dec); err != nil {
			t.Fatalf("check %d: %v", i, err)
		}
		for j, n := range nodes {
			testkit.WaitFor(t, "request at every address", func() bool { return n.count(wire.KindRateRequest) == i })
			if rs := n.received(); rs[len(rs)-1].from.Addr().Is6() != (j == 2) {
				t.Errorf("node %d got the request from %v", j, rs[len(rs)-1].from)
			}
		}
	}
}

// TestFailureWarningRateLimited: checks that fail for lack of RateLimitly
// log one warning per WarnInterval, carrying how many failed.
func TestFailureWarningRateLimited(t *testing.T) {
	d, nodes := fakeCluster(t, 1)
	nodes[0].set(func(n *fakeNode) { n.drop = true })
	clk := newManualClock(time.Now())
	u := 20 * time.Millisecond
	var logged bytes.Buffer
	lg := slog.New(slog.NewTextHandler(&syncWriter{w: &logged}, &slog.HandlerOptions{Level: slog.LevelWarn}))
	c := newTestClient(t, d.Addr(), clientOpts{clock: clk, policy: ratelimitly.SingleRound(u), log: lg})
	waitReady(t, c)
	fail := func() {
		t.Helper()
		ch := checkAsync(context.Background(), c, testRequest())
		testkit.WaitFor(t, "send", func() bool { return c.Stats().InFlight == 1 })
		clk.Advance(u)
		if r := await(t, ch); r.err != ErrTimeout {
			t.Fatalf("err %v", r.err)
		}
	}
	for i := 0; i < 4; i++ {
		fail()
	}
	if w := c.Stats().FailureWarns; w != 1 {
		t.Fatalf("warnings after 4 failures = %d, want 1", w)
	}
	clk.Advance(WarnInterval)
	fail()
	if w := c.Stats().FailureWarns; w != 2 {
		t.Fatalf("warnings after the interval = %d, want 2", w)
	}
	out := logged.String()
	if !strings.Contains(out, "failed_checks=1 ") || !strings.Contains(out, "failed_checks=4 ") || !strings.Contains(out, "cause=timeout") {
		t.Errorf("log:\n%s", out)
	}
}

type syncWriter struct {
	mu sync.Mutex
	w  *bytes.Buffer
}

func (s *syncWriter) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.Write(p)
}
