package rlclient

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/rl-tproxy/rl-tproxy/internal/dnstest"
	"github.com/rl-tproxy/rl-tproxy/internal/testkit"
	"github.com/rl-tproxy/rl-tproxy/pkg/ratelimitly"
	"github.com/rl-tproxy/rl-tproxy/pkg/ratelimitly/wire"
)

// fakeCluster starts n fake nodes (epochs 1000, 2000, ...) behind a DNS
// server.
func fakeCluster(t *testing.T, n int) (*dnstest.Server, []*fakeNode) {
	t.Helper()
	d := dnstest.Start(t)
	var nodes []*fakeNode
	var addrs []netip.AddrPort
	for i := 0; i < n; i++ {
		fn := startFakeNode(t, uint64(1000*(i+1)), testCred())
		nodes = append(nodes, fn)
		addrs = append(addrs, fn.addr())
	}
	d.SetSRV(testSRV, targetsFor(addrs...)...)
	return d, nodes
}

func TestFakeAllowDenyPrefersOldest(t *testing.T) {
	d, nodes := fakeCluster(t, 3)
	c := newTestClient(t, d.Addr(), clientOpts{})
	waitReady(t, c)
	var dec Decision
	req := testRequest()
	// Learn every epoch: first checks end on "all answered" or on the
	// first (trivially oldest known) answer.
	for i := 0; i < 20; i++ {
		if err := c.Check(context.Background(), req, &dec); err != nil {
			t.Fatalf("check %d: %v (%v)", i, err, dec.Cause)
		}
	}
	testkit.WaitFor(t, "epochs learned", func() bool {
		m := c.disc.current()
		for _, e := range m.eps {
			if e.epoch.Load() == 0 {
				return false
			}
		}
		return true
	})
	if err := c.Check(context.Background(), req, &dec); err != nil || dec.Cause != CauseAllow || !dec.Allow {
		t.Fatalf("allow: err %v decision %+v", err, dec)
	}
	if dec.ServerEpoch != 1000 || dec.Endpoint != "n1.rl.test." {
		t.Errorf("chosen answer epoch %d from %s, want the oldest (1000, n1.rl.test.)", dec.ServerEpoch, dec.Endpoint)
	}
	if len(dec.Guards) != 1 || !dec.Guards[0].Passed || len(dec.Resources) != 1 || dec.Resources[0].Remaining != 5 {
		t.Errorf("results not copied: %+v", dec)
	}
	for _, n := range nodes {
		n.set(func(n *fakeNode) { n.deny = true })
	}
	if err := c.Check(context.Background(), req, &dec); err != nil || !dec.Cause.Denied() || dec.Allow {
		t.Fatalf("deny: err %v decision %+v", err, dec)
	}
	if dec.RetryAfter() != 250*time.Millisecond {
		t.Errorf("retry after = %v", dec.RetryAfter())
	}
	// The oldest node's answer decides even when a younger one disagrees.
	nodes[0].set(func(n *fakeNode) { n.deny = false })
	if err := c.Check(context.Background(), req, &dec); err != nil || dec.Cause != CauseAllow || dec.ServerEpoch != 1000 {
		t.Fatalf("oldest allow over younger deny: err %v decision %+v", err, dec)
	}
	st := c.Stats()
	if st.Causes[CauseAllow] != 22 || st.Causes[ratelimitly.CauseDenyResource] != 1 || st.InFlight != 0 {
		t.Errorf("stats causes %v inflight %d", st.Causes, st.InFlight)
	}
}

func TestFakeTimeoutAtHorizonWithReplay(t *testing.T) {
	d, nodes := fakeCluster(t, 3)
	for _, n := range nodes {
		n.set(func(n *fakeNode) { n.drop = true })
	}
	clk := newManualClock(time.Now())
	u := 20 * time.Millisecond
	c := newTestClient(t, d.Addr(), clientOpts{clock: clk, policy: ratelimitly.Standard(u)})
	waitReady(t, c)
	ch := checkAsync(context.Background(), c, testRequest())
	testkit.WaitFor(t, "first round", func() bool { return allCount(nodes, wire.KindRateRequest) == 3 })
	assertPending(t, ch, "at 0")
	clk.Advance(u - time.Millisecond)
	assertPending(t, ch, "before U")
	clk.Advance(time.Millisecond) // U: no answer -> replay to all three
	testkit.WaitFor(t, "replay round", func() bool { return allCount(nodes, wire.KindRateRequest) == 6 })
	for _, n := range nodes {
		rs := n.received()
		if rs[0].id != rs[1].id || rs[1].attempt != 1 || !rs[1].replay || rs[0].replay || rs[0].attempt != 0 {
			t.Errorf("replay datagram %+v after %+v", rs[1], rs[0])
		}
	}
	clk.Advance(u) // 2U: still nothing -> receive only
	assertPending(t, ch, "at 2U")
	clk.Advance(u - time.Millisecond)
	assertPending(t, ch, "just before 3U")
	clk.Advance(time.Millisecond)
	r := await(t, ch)
	if r.err != ErrTimeout || r.d.Cause != CauseTimeout || r.d.Attempts != 2 {
		t.Fatalf("horizon: err %v decision %+v", r.err, r.d)
	}
	if got := allCount(nodes, wire.KindRateRequest); got != 6 {
		t.Errorf("requests sent = %d, want 6 (no send in the receive-only unit)", got)
	}
	if allCount(nodes, wire.KindCompletion) != 0 {
		t.Error("completion sent without a decision")
	}
}

func TestFakeAnswerInFinalReceiveDecides(t *testing.T) {
	d, nodes := fakeCluster(t, 2)
	for _, n := range nodes {
		n.set(func(n *fakeNode) { n.drop = true })
	}
	clk := newManualClock(time.Now())
	u := 20 * time.Millisecond
	c := newTestClient(t, d.Addr(), clientOpts{clock: clk, policy: ratelimitly.Standard(u)})
	waitReady(t, c)
	ch := checkAsync(context.Background(), c, testRequest())
	testkit.WaitFor(t, "first round", func() bool { return allCount(nodes, wire.KindRateRequest) == 2 })
	clk.Advance(u)
	testkit.WaitFor(t, "replay", func() bool { return allCount(nodes, wire.KindRateRequest) == 4 })
	clk.Advance(u) // into the receive-only unit
	// Answer only now: node 2 replays its answer by hand.
	nodes[1].set(func(n *fakeNode) { n.drop = false })
	resendLast(t, c, nodes[1])
	r := await(t, ch)
	if r.err != nil || r.d.Cause != CauseAllow || r.d.Endpoint != "n2.rl.test." {
		t.Fatalf("final receive: err %v decision %+v", r.err, r.d)
	}
	// Completion to node 1, which never answered.
	testkit.WaitFor(t, "completion", func() bool { return nodes[0].count(wire.KindCompletion) == 1 })
	if nodes[1].count(wire.KindCompletion) != 0 {
		t.Error("completion sent to a node that answered")
	}
}

// resendLast makes node answer again by sending it a copy of the latest
// request: the fake node answers every request it receives.
func resendLast(t *testing.T, c *Client, n *fakeNode) {
	t.Helper()
	rs := n.received()
	last := rs[len(rs)-1]
	// Re-seal a replay with the client's key from the client's socket so the
	// answer goes back to the client.
	r := c.table.get(last.id)
	if r == nil {
		t.Fatal("request no longer live")
	}
	r.mu.Lock()
	h := wire.Header{Kind: wire.KindRateRequest, Attempt: r.attempt, Flags: wire.FlagReplay, TTLms: c.ttlMs, RequestID: r.id,
		Timestamp: uint64(c.clock.Now().UnixMilli())}
	pkt, err := c.key.Seal(make([]byte, 0, wire.MaxDatagram), &h, testRequest())
	sock := r.sock
	r.mu.Unlock()
	if err != nil {
		t.Fatal(err)
	}
	if err := c.ring.Send(sock, n.addr(), pkt, 0); err != nil {
		t.Fatal(err)
	}
}

func allCount(nodes []*fakeNode, k wire.Kind) int {
	total := 0
	for _, n := range nodes {
		total += n.count(k)
	}
	return total
}

func TestFakeSingleRoundTimesOutAtUnit(t *testing.T) {
	d, nodes := fakeCluster(t, 3)
	for _, n := range nodes {
		n.set(func(n *fakeNode) { n.drop = true })
	}
	clk := newManualClock(time.Now())
	u := 30 * time.Millisecond
	c := newTestClient(t, d.Addr(), clientOpts{clock: clk, policy: ratelimitly.SingleRound(u)})
	waitReady(t, c)
	if c.Horizon() != u {
		t.Fatalf("horizon %v", c.Horizon())
	}
	ch := checkAsync(context.Background(), c, testRequest())
	testkit.WaitFor(t, "send", func() bool { return allCount(nodes, wire.KindRateRequest) == 3 })
	clk.Advance(u - time.Millisecond)
	assertPending(t, ch, "before U")
	clk.Advance(time.Millisecond)
	r := await(t, ch)
	if r.err != ErrTimeout || r.d.Attempts != 1 {
		t.Fatalf("single round: err %v decision %+v", r.err, r.d)
	}
	if allCount(nodes, wire.KindRateRequest) != 3 {
		t.Error("single_round replayed")
	}
}

func TestFakeOneDownDecidedAtUnitWithoutReplay(t *testing.T) {
	d, nodes := fakeCluster(t, 3)
	clk := newManualClock(time.Now())
	u := 20 * time.Millisecond
	c := newTestClient(t, d.Addr(), clientOpts{clock: clk, policy: ratelimitly.Standard(u)})
	waitReady(t, c)
	// Learn epochs with everyone up.
	var dec Decision
	for i := 0; i < 5; i++ {
		if err := c.Check(context.Background(), testRequest(), &dec); err != nil {
			t.Fatal(err)
		}
	}
	testkit.WaitFor(t, "epochs", func() bool { return c.disc.current().eps[0].epoch.Load() == 1000 })
	// The oldest node goes down: the younger answers cannot decide early,
	// the unit deadline decides with the oldest valid answer.
	nodes[0].set(func(n *fakeNode) { n.drop = true })
	// Let the learning checks' datagrams land (early decisions return
	// before every node has seen its request).
	testkit.WaitFor(t, "learning traffic", func() bool { return allCount(nodes, wire.KindRateRequest) == 15 })
	before := allCount(nodes, wire.KindRateRequest)
	compBefore := nodes[0].count(wire.KindCompletion)
	ch := checkAsync(context.Background(), c, testRequest())
	waitValid(t, c, 2)
	assertPending(t, ch, "before U")
	clk.Advance(u)
	r := await(t, ch)
	if r.err != nil || r.d.Cause != CauseAllow || r.d.ServerEpoch != 2000 || r.d.Attempts != 1 {
		t.Fatalf("one down: err %v decision %+v", r.err, r.d)
	}
	if got := allCount(nodes, wire.KindRateRequest) - before; got != 3 {
		t.Errorf("requests for the check = %d, want 3 (no replay)", got)
	}
	testkit.WaitFor(t, "completion to the down node", func() bool { return nodes[0].count(wire.KindCompletion) == compBefore+1 })
	rs := nodes[0].received()
	last, req := rs[len(rs)-1], rs[len(rs)-2]
	if last.kind != wire.KindCompletion || last.decision != wire.DecisionAllow || last.id != req.id || req.kind != wire.KindRateRequest {
		t.Errorf("completion %+v for request %+v", last, req)
	}
}

func TestFakeWrongKeyIgnored(t *testing.T) {
	d := dnstest.Start(t)
	good := startFakeNode(t, 1000, testCred())
	bad := startFakeNode(t, 500, wrongCred()) // older, but cannot authenticate
	d.SetSRV(testSRV, targetsFor(bad.addr(), good.addr())...)
	d.SetTTL(5, 5)
	clk := newManualClock(time.Now())
	c := newTestClient(t, d.Addr(), clientOpts{clock: clk})
	waitReady(t, c)
	var dec Decision
	if err := c.Check(context.Background(), testRequest(), &dec); err != nil || dec.Endpoint != "n2.rl.test." || dec.ServerEpoch != 1000 {
		t.Fatalf("err %v decision %+v", err, dec)
	}
	testkit.WaitFor(t, "auth drop", func() bool { return c.Stats().Drops.Auth >= 1 })
	// Only the wrong-key node: no decision; at the horizon the cause is
	// authentication/protocol, not a plain timeout.
	d.SetSRV(testSRV, targetsFor(bad.addr())...)
	clk.Advance(MinRefresh)
	testkit.WaitFor(t, "membership of one", func() bool { return c.Stats().Endpoints == 1 })
	ch := checkAsync(context.Background(), c, testRequest())
	testkit.WaitFor(t, "wrong-key answer", func() bool { return c.Stats().Drops.Auth >= 2 })
	u := c.policy.Unit
	clk.Advance(u)
	testkit.WaitFor(t, "replay", func() bool { return bad.count(wire.KindRateRequest) >= 3 })
	clk.Advance(u)
	clk.Advance(u)
	r := await(t, ch)
	if r.err != ErrProtocol || r.d.Cause != CauseProtocol {
		t.Fatalf("wrong key only: err %v decision %+v", r.err, r.d)
	}
}

func TestFakeSteeringRebinds(t *testing.T) {
	d, nodes := fakeCluster(t, 3)
	nodes[2].set(func(n *fakeNode) { n.steer = true })
	c := newTestClient(t, d.Addr(), clientOpts{shards: 1})
	waitReady(t, c)
	before := c.ring.LocalAddr(0)
	var dec Decision
	for i := 0; i < 10; i++ {
		if err := c.Check(context.Background(), testRequest(), &dec); err != nil {
			t.Fatalf("check %d: %v", i, err)
		}
	}
	testkit.WaitFor(t, "rebind", func() bool { return c.Stats().Ring.Rebinds >= 1 })
	nodes[2].set(func(n *fakeNode) { n.steer = false })
	for i := 0; i < 10; i++ {
		if err := c.Check(context.Background(), testRequest(), &dec); err != nil {
			t.Fatalf("check after rebind %d: %v", i, err)
		}
	}
	if c.ring.LocalAddr(0) == before {
		t.Error("source port unchanged")
	}
	// A check returns at its decision, which another node's answer can
	// make before node 0 has read its copy: wait for all 20.
	testkit.WaitFor(t, "node 0 got every request", func() bool { return nodes[0].count(wire.KindRateRequest) >= 20 })
	ports := map[uint16]bool{}
	for _, s := range nodes[0].received() {
		ports[s.from.Port()] = true
	}
	if len(ports) < 2 {
		t.Errorf("node saw source ports %v, want the old and the new", ports)
	}
	testkit.WaitFor(t, "old socket retired", func() bool { st := c.Stats().Ring; return st.Sockets == 1 && st.Retired >= 1 })
}

func TestFakeCancelRetires(t *testing.T) {
	d, nodes := fakeCluster(t, 2)
	for _, n := range nodes {
		n.set(func(n *fakeNode) { n.drop = true })
	}
	clk := newManualClock(time.Now())
	c := newTestClient(t, d.Addr(), clientOpts{clock: clk})
	waitReady(t, c)
	ctx, cancel := context.WithCancel(context.Background())
	ch := checkAsync(ctx, c, testRequest())
	testkit.WaitFor(t, "sent", func() bool { return allCount(nodes, wire.KindRateRequest) == 2 })
	cancel()
	r := await(t, ch)
	if r.err != ErrCancelled || r.d.Cause != CauseCancelled {
		t.Fatalf("err %v decision %+v", r.err, r.d)
	}
	if st := c.Stats(); st.InFlight != 0 {
		t.Errorf("in flight %d", st.InFlight)
	}
	// Retired synchronously: no deadline left in any shard's timer heap and
	// nothing in the request table, so no timer can fire for it later.
	for _, es := range c.shards {
		es.mu.Lock()
		n := es.pendingLocked()
		es.mu.Unlock()
		if n != 0 {
			t.Errorf("shard %d still holds %d deadlines", es.idx, n)
		}
	}
	if c.table.get(nodes[0].received()[0].id) != nil {
		t.Error("cancelled request still in the table")
	}
	// Already-cancelled context: no send at all.
	var dec Decision
	if err := c.Check(ctx, testRequest(), &dec); err != ErrCancelled {
		t.Fatalf("pre-cancelled: %v", err)
	}
}

func TestFakeConstructionError(t *testing.T) {
	d, _ := fakeCluster(t, 1)
	c := newTestClient(t, d.Addr(), clientOpts{})
	waitReady(t, c)
	var dec Decision
	req := testRequest()
	req.Label = []byte(strings.Repeat("x", wire.MaxLabel+1))
	if err := c.Check(context.Background(), req, &dec); err != ErrConstruction || dec.Cause != CauseConstruction || dec.Err == nil {
		t.Fatalf("long label: err %v decision %+v", err, dec)
	}
	req = testRequest()
	for i := 0; i < 3; i++ {
		req.Resources = append(req.Resources, wire.Resource{Bucket: []byte(strings.Repeat("b", 500)), Rate: 1, PeriodMs: 1, Cost: 1})
	}
	if err := c.Check(context.Background(), req, &dec); err != ErrConstruction || dec.Err != wire.ErrTooLarge {
		t.Fatalf("oversize: err %v decision %+v", err, dec)
	}
}

func TestFakeSendFailure(t *testing.T) {
	d := dnstest.Start(t)
	// A socket bound to 127.0.0.1 cannot reach TEST-NET-1: the kernel
	// refuses the datagram locally, nothing leaves the host.
	d.SetSRV(testSRV, dnstest.Target{Name: "far.rl.test", Port: 9, Addrs: []netip.Addr{netip.MustParseAddr("192.0.2.1")}})
	c := newTestClient(t, d.Addr(), clientOpts{})
	waitReady(t, c)
	var dec Decision
	if err := c.Check(context.Background(), testRequest(), &dec); err != ErrSendFailure || dec.Cause != CauseSendFailure {
		t.Fatalf("err %v decision %+v", err, dec)
	}
}

func TestReportFireAndForget(t *testing.T) {
	d, nodes := fakeCluster(t, 2)
	// Discovery cannot succeed while DNS fails, so this Report certainly
	// comes before it (no race with the asynchronous first lookup).
	d.SetMode(dnstest.ModeServFail)
	c := newTestClient(t, d.Addr(), clientOpts{})
	c.Report([]byte("svc"), time.Second) // before discovery: dropped, never blocks
	if c.Ready() {
		t.Fatal("ready although every DNS answer is SERVFAIL")
	}
	if st := c.Stats(); st.Reports != 0 || st.ReportsDropped != 1 {
		t.Fatalf("before discovery: reports %d dropped %d, want 0 and 1", st.Reports, st.ReportsDropped)
	}
	d.SetMode(dnstest.ModeOK) // the retry (discovery.RetryMin) succeeds
	waitReady(t, c)
	c.Report([]byte("svc-a"), 1500*time.Microsecond)
	c.Report(nil, time.Second)
	testkit.WaitFor(t, "reports", func() bool { return allCount(nodes, wire.KindLatencyReport) == 2 })
	st := c.Stats()
	if st.Reports != 2 || st.ReportsDropped != 2 {
		t.Errorf("reports %d dropped %d", st.Reports, st.ReportsDropped)
	}
}

func TestPolicies(t *testing.T) {
	u := 10 * time.Millisecond
	tests := []struct {
		p    ratelimitly.RequestPolicy
		want time.Duration
	}{
		{ratelimitly.Standard(u), 3 * u},
		{ratelimitly.SingleRound(u), u},
		{ratelimitly.Standard(0), 3 * ratelimitly.DefaultUnit},
		{ratelimitly.RequestPolicy{Name: ratelimitly.PolicyCustom, Unit: u, ReplayGaps: []time.Duration{5 * time.Millisecond, 7 * time.Millisecond}, Replays: 3, FinalReceive: 2 * time.Millisecond}, u + 5*time.Millisecond + 14*time.Millisecond + 2*time.Millisecond},
		{ratelimitly.RequestPolicy{Name: ratelimitly.PolicyCustom, Unit: u, Replays: 2}, 3 * u},
	}
	for _, tc := range tests {
		if got := tc.p.Horizon(); got != tc.want {
			t.Errorf("%s %+v: horizon %v, want %v", tc.p.Name, tc.p, got, tc.want)
		}
		if err := tc.p.Validate(testCred()); err != nil {
			t.Errorf("%s: %v", tc.p.Name, err)
		}
	}
	cred := testCred()
	cred.MaxHorizon = 50 * time.Millisecond
	for _, bad := range []ratelimitly.RequestPolicy{
		{Name: ratelimitly.PolicyCustom},
		{Name: ratelimitly.PolicyCustom, Unit: u, Replays: -1},
		{Name: ratelimitly.PolicyCustom, Unit: u, Replays: ratelimitly.MaxReplays + 1},
		{Name: ratelimitly.PolicyCustom, Unit: u, ReplayGaps: []time.Duration{0}, Replays: 1},
		{Name: ratelimitly.PolicyCustom, Unit: 70 * time.Second},
		{Name: ratelimitly.PolicyCustom, Unit: u, FinalReceive: -1},
		ratelimitly.Standard(20 * time.Millisecond), // 60ms > max_horizon 50ms
	} {
		if err := bad.Validate(cred); err == nil {
			t.Errorf("policy %+v accepted", bad)
		}
	}
}

func TestCauseStrings(t *testing.T) {
	// Every failure a check can end with has its own error.
	for _, c := range CheckCauses {
		if !c.Decided() && causeErr[c] == nil {
			t.Errorf("cause %s has no error", c)
		}
	}
	for i, e := range causeErr {
		for j, f := range causeErr {
			if i != j && e != nil && e == f {
				t.Errorf("causes %d and %d share an error", i, j)
			}
		}
	}
}

func TestCloseEndsChecksInFlight(t *testing.T) {
	d, nodes := fakeCluster(t, 2)
	for _, n := range nodes {
		n.set(func(n *fakeNode) { n.drop = true })
	}
	clk := newManualClock(time.Now())
	c := newTestClient(t, d.Addr(), clientOpts{clock: clk})
	waitReady(t, c)
	ch := checkAsync(context.Background(), c, testRequest())
	testkit.WaitFor(t, "sent", func() bool { return allCount(nodes, wire.KindRateRequest) == 2 })
	c.Close()
	if r := await(t, ch); r.err != ErrCancelled || r.d.Cause != CauseCancelled {
		t.Fatalf("in flight at close: err %v decision %+v", r.err, r.d)
	}
	var dec Decision
	if err := c.Check(context.Background(), testRequest(), &dec); err != ErrClosed || dec.Cause != CauseNoEndpoints {
		t.Fatalf("after close: err %v decision %+v", err, dec)
	}
	c.Report([]byte("svc"), time.Second) // dropped, no panic
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
}

func TestFakeCustomPolicySchedule(t *testing.T) {
	d, nodes := fakeCluster(t, 2)
	for _, n := range nodes {
		n.set(func(n *fakeNode) { n.drop = true })
	}
	clk := newManualClock(time.Now())
	ms := time.Millisecond
	// Unit 10, replays after 10 (gap 5) and after 15 (gap 7) and after 22
	// (gap 7 again: the last gap repeats), final receive 3: horizon 32.
	p := ratelimitly.RequestPolicy{Name: ratelimitly.PolicyCustom, Unit: 10 * ms, ReplayGaps: []time.Duration{5 * ms, 7 * ms}, Replays: 3, FinalReceive: 3 * ms, Completion: true}
	c := newTestClient(t, d.Addr(), clientOpts{clock: clk, policy: p})
	waitReady(t, c)
	if c.Horizon() != 32*ms || c.ttlMs != 32 {
		t.Fatalf("horizon %v ttl %d", c.Horizon(), c.ttlMs)
	}
	ch := checkAsync(context.Background(), c, testRequest())
	sends := func(n int) func() bool { return func() bool { return allCount(nodes, wire.KindRateRequest) == n } }
	testkit.WaitFor(t, "first send", sends(2))
	steps := []struct {
		advance time.Duration
		want    int // requests seen by the nodes after the step
	}{
		{9 * ms, 2}, {1 * ms, 4}, // replay 1 at 10
		{4 * ms, 4}, {1 * ms, 6}, // replay 2 at 15
		{6 * ms, 6}, {1 * ms, 8}, // replay 3 at 22
		{6 * ms, 8}, {1 * ms, 8}, // 29: receive only
	}
	for i, st := range steps {
		clk.Advance(st.advance)
		if st.want != allCount(nodes, wire.KindRateRequest) {
			testkit.WaitFor(t, fmt.Sprintf("step %d: %d requests", i, st.want), sends(st.want))
		}
		assertPending(t, ch, fmt.Sprintf("step %d", i))
	}
	for _, n := range nodes {
		for k, s := range n.received() {
			if int(s.attempt) != k || s.replay != (k > 0) {
				t.Errorf("request %d: attempt %d replay %v", k, s.attempt, s.replay)
			}
		}
	}
	clk.Advance(2 * ms)
	assertPending(t, ch, "31ms")
	clk.Advance(1 * ms)
	if r := await(t, ch); r.err != ErrTimeout || r.d.Attempts != 4 {
		t.Fatalf("custom horizon: err %v decision %+v", r.err, r.d)
	}
}

func TestFakeAnswerOnAnotherShardSocket(t *testing.T) {
	d, nodes := fakeCluster(t, 2)
	c := newTestClient(t, d.Addr(), clientOpts{shards: 2})
	waitReady(t, c)
	// Every answer goes to shard 1's socket, whichever shard sent.
	for _, n := range nodes {
		n.set(func(n *fakeNode) { n.replyTo = c.ring.LocalAddr(1) })
	}
	var dec Decision
	for i := 0; i < 10; i++ {
		if err := c.Check(context.Background(), testRequest(), &dec); err != nil || !dec.Cause.Decided() {
			t.Fatalf("check %d: err %v decision %+v", i, err, dec)
		}
	}
	// Requests left from both shards' sockets (the nodes record them
	// asynchronously: an early decision does not wait for every node).
	testkit.WaitFor(t, "requests from both shards", func() bool {
		sentFrom := map[uint16]bool{}
		for _, s := range nodes[0].received() {
			sentFrom[s.from.Port()] = true
		}
		return len(sentFrom) == 2
	})
}
