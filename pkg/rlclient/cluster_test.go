package rlclient

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rl-tproxy/rl-tproxy/internal/dnstest"
	"github.com/rl-tproxy/rl-tproxy/internal/testkit"
	"github.com/rl-tproxy/rl-tproxy/internal/testkit/rlcluster"
	"github.com/rl-tproxy/rl-tproxy/pkg/ratelimitly"
	"github.com/rl-tproxy/rl-tproxy/pkg/ratelimitly/credentials"
	"github.com/rl-tproxy/rl-tproxy/pkg/ratelimitly/wire"
	"github.com/rl-tproxy/rl-tproxy/pkg/rlserver"
)

// nodeCtl switches the misbehaviour of one rlserver node at run time.
type nodeCtl struct {
	dropRequests atomic.Bool
	dropAttempt0 atomic.Bool
	steer        atomic.Bool
	extraGuard   atomic.Bool
}

func (n *nodeCtl) hooks() *rlserver.TestHooks {
	return &rlserver.TestHooks{
		DropRequest: func(h *wire.Header) bool {
			if h.Kind != wire.KindRateRequest {
				return false
			}
			return n.dropRequests.Load() || (n.dropAttempt0.Load() && h.Attempt == 0)
		},
		MutateResponse: func(resp *wire.RateResponse) {
			if n.extraGuard.Load() {
				resp.Guards = append(resp.Guards, wire.GuardResult{Passed: true})
			}
		},
		ForceSteer: func(*wire.Header) bool { return n.steer.Load() },
	}
}

type cluster struct {
	dns     *dnstest.Server
	servers []*rlserver.Server
	ctl     []*nodeCtl
}

// startCluster starts n rlserver nodes on loopback behind an in-process DNS
// server (rlcluster). With a clock, node i runs on clock time + i ms, so
// epochs are distinct and node 0 is the oldest. Node i accepts creds[i]
// when given, testCred() otherwise.
func startCluster(t testing.TB, n int, clk *manualClock, creds ...credentials.Credential) *cluster {
	t.Helper()
	cl := &cluster{}
	for range n {
		cl.ctl = append(cl.ctl, &nodeCtl{})
	}
	rc := rlcluster.Start(t, rlcluster.Config{Nodes: n, SRV: testSRV, Node: func(i int, cfg *rlserver.Config) {
		cfg.Credentials = []credentials.Credential{testCred()}
		if i < len(creds) {
			cfg.Credentials = []credentials.Credential{creds[i]}
		}
		cfg.Hooks = cl.ctl[i].hooks()
		if clk != nil {
			off := time.Duration(i) * time.Millisecond
			cfg.Now = func() time.Time { return clk.Now().Add(off) }
		}
	}})
	cl.dns, cl.servers = rc.DNS, rc.Servers
	return cl
}

// bucketRequest asks for one token of a fresh bucket with capacity burst
// that does not refill during the test.
func bucketRequest(name string, burst uint32) *wire.RateRequest {
	return &wire.RateRequest{
		Guards:    []wire.Guard{{Service: []byte("svc-" + name), ThresholdMs: 1000}},
		Resources: []wire.Resource{{Bucket: []byte(name), Rate: 1, PeriodMs: 3_600_000, Burst: burst, Cost: 1}},
	}
}

// learnEpochs runs checks until the client knows every endpoint's epoch.
func learnEpochs(t testing.TB, c *Client) {
	t.Helper()
	var dec Decision
	testkit.WaitFor(t, "epochs", func() bool {
		if err := c.Check(context.Background(), testRequest(), &dec); err != nil {
			t.Fatalf("check: %v", err)
		}
		for _, e := range c.disc.current().eps {
			if e.epoch.Load() == 0 {
				return false
			}
		}
		return true
	})
}

func TestClusterAllowDeny(t *testing.T) {
	cl := startCluster(t, 3, nil)
	c := newTestClient(t, cl.dns.Addr(), clientOpts{})
	waitReady(t, c)
	req := bucketRequest("allow-deny", 3)
	var dec Decision
	for i := 0; i < 3; i++ {
		if err := c.Check(context.Background(), req, &dec); err != nil || dec.Cause != CauseAllow {
			t.Fatalf("check %d: err %v decision %+v", i, err, dec)
		}
		if dec.Resources[0].Remaining != uint32(2-i) {
			t.Errorf("check %d: remaining %d", i, dec.Resources[0].Remaining)
		}
	}
	err := c.Check(context.Background(), req, &dec)
	if err != nil || dec.Cause != ratelimitly.CauseDenyResource || dec.Allow || dec.Resources[0].TokensDeficit != 1 || dec.RetryAfter() <= 0 {
		t.Fatalf("4th check: err %v decision %+v", err, dec)
	}
	// Every node saw every check once (fan-out, no double consumption).
	testkit.WaitFor(t, "all nodes decided all checks", func() bool {
		for _, s := range cl.servers {
			if st := s.Stats(); st.Requests+st.CompletionsApplied != 4 {
				return false
			}
		}
		return true
	})
}

func TestClusterOneNodeDownDecidedWithinUnit(t *testing.T) {
	clk := newManualClock(time.Now())
	cl := startCluster(t, 3, clk)
	u := 20 * time.Millisecond
	c := newTestClient(t, cl.dns.Addr(), clientOpts{clock: clk, policy: ratelimitly.Standard(u)})
	waitReady(t, c)
	learnEpochs(t, c)
	cl.servers[0].Close() // the oldest node
	ch := checkAsync(context.Background(), c, testRequest())
	waitValid(t, c, 2)
	assertPending(t, ch, "before U (the oldest known node has not answered)")
	clk.Advance(u)
	r := await(t, ch)
	if r.err != nil || !r.d.Cause.Decided() || r.d.Attempts != 1 || r.d.ServerEpoch != cl.servers[1].Epoch() {
		t.Fatalf("err %v decision %+v (epochs %d %d %d)", r.err, r.d, cl.servers[0].Epoch(), cl.servers[1].Epoch(), cl.servers[2].Epoch())
	}
}

func TestClusterAllDownTimesOutAtHorizon(t *testing.T) {
	clk := newManualClock(time.Now())
	cl := startCluster(t, 3, clk)
	u := 20 * time.Millisecond
	c := newTestClient(t, cl.dns.Addr(), clientOpts{clock: clk, policy: ratelimitly.Standard(u)})
	waitReady(t, c)
	for _, s := range cl.servers {
		s.Close()
	}
	sent := c.Stats().Ring.Sent
	ch := checkAsync(context.Background(), c, testRequest())
	testkit.WaitFor(t, "fan-out", func() bool { return c.Stats().Ring.Sent == sent+3 })
	clk.Advance(u)
	testkit.WaitFor(t, "replay", func() bool { return c.Stats().Ring.Sent == sent+6 })
	clk.Advance(u)
	clk.Advance(u - time.Millisecond)
	assertPending(t, ch, "just before 3U")
	clk.Advance(time.Millisecond)
	r := await(t, ch)
	if r.err != ErrTimeout || r.d.Cause != CauseTimeout {
		t.Fatalf("err %v decision %+v", r.err, r.d)
	}
	if st := c.Stats(); st.Replays != 3 || st.Ring.Sent != sent+6 || st.Completions != 0 {
		t.Errorf("replays %d sent %d completions %d", st.Replays, st.Ring.Sent-sent, st.Completions)
	}
}

func TestClusterWrongKeyNodeIgnored(t *testing.T) {
	cl := startCluster(t, 3, nil, wrongCred())
	c := newTestClient(t, cl.dns.Addr(), clientOpts{})
	waitReady(t, c)
	var dec Decision
	for i := 0; i < 10; i++ {
		if err := c.Check(context.Background(), testRequest(), &dec); err != nil || !dec.Cause.Decided() {
			t.Fatalf("check %d: err %v decision %+v", i, err, dec)
		}
		if dec.Endpoint == "n1.rl.test." {
			t.Fatalf("decision taken from the wrong-key node")
		}
	}
	testkit.WaitFor(t, "auth drops at the wrong-key node", func() bool { return cl.servers[0].Stats().Drops["auth"] >= 10 })
	if st := cl.servers[0].Stats(); st.Requests != 0 {
		t.Errorf("wrong-key node decided %d requests", st.Requests)
	}
}

func TestClusterCardinalityMismatchNeverDecides(t *testing.T) {
	cl := startCluster(t, 3, nil)
	for _, ctl := range cl.ctl {
		ctl.extraGuard.Store(true)
	}
	// Every node answers invalidly: each check replays at U and fails once
	// the replays are answered the same way (a short unit keeps it quick).
	c := newTestClient(t, cl.dns.Addr(), clientOpts{policy: ratelimitly.Standard(200 * time.Millisecond)})
	waitReady(t, c)
	var dec Decision
	for i := 0; i < 5; i++ {
		err := c.Check(context.Background(), testRequest(), &dec)
		if err != ErrCardinality || dec.Cause != CauseCardinality || dec.Allow || len(dec.Guards) != 0 || dec.Attempts != 2 {
			t.Fatalf("check %d: err %v decision %+v", i, err, dec)
		}
	}
	if st := c.Stats(); st.Completions != 0 {
		t.Errorf("completions after a non-decision: %d", st.Completions)
	}
	// Only one node misbehaves: the others decide.
	cl.ctl[1].extraGuard.Store(false)
	cl.ctl[2].extraGuard.Store(false)
	for i := 0; i < 5; i++ {
		if err := c.Check(context.Background(), testRequest(), &dec); err != nil || dec.Endpoint == "n1.rl.test." {
			t.Fatalf("mixed %d: err %v decision %+v", i, err, dec)
		}
	}
}

// lossyRelay forwards datagrams between the client and one node and can
// drop the node's answers: it stands in for a lost response.
type lossyRelay struct {
	front, back *net.UDPConn
	dropAnswers atomic.Int32
	mu          sync.Mutex
	client      netip.AddrPort
}

func startRelay(t testing.TB, node netip.AddrPort) *lossyRelay {
	t.Helper()
	front, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	back, err := net.DialUDP("udp4", nil, net.UDPAddrFromAddrPort(node))
	if err != nil {
		t.Fatal(err)
	}
	r := &lossyRelay{front: front, back: back}
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		buf := make([]byte, 2048)
		for {
			n, from, err := front.ReadFromUDPAddrPort(buf)
			if err != nil {
				return
			}
			r.mu.Lock()
			r.client = from
			r.mu.Unlock()
			back.Write(buf[:n])
		}
	}()
	go func() {
		defer wg.Done()
		buf := make([]byte, 2048)
		for {
			n, err := back.Read(buf)
			if err != nil {
				return
			}
			if r.dropAnswers.Add(-1) >= 0 {
				continue
			}
			r.mu.Lock()
			to := r.client
			r.mu.Unlock()
			front.WriteToUDPAddrPort(buf[:n], to)
		}
	}()
	t.Cleanup(func() { front.Close(); back.Close(); wg.Wait() })
	return r
}

func (r *lossyRelay) addr() netip.AddrPort { return r.front.LocalAddr().(*net.UDPAddr).AddrPort() }

func TestClusterReplayConsumesOnce(t *testing.T) {
	clk := newManualClock(time.Now())
	cl := startCluster(t, 1, clk)
	relay := startRelay(t, cl.servers[0].Addr())
	relay.dropAnswers.Store(1) // the answer to the first attempt is lost
	cl.dns.SetSRV(testSRV, targetsFor(relay.addr())...)
	u := 20 * time.Millisecond
	c := newTestClient(t, cl.dns.Addr(), clientOpts{clock: clk, policy: ratelimitly.Standard(u)})
	waitReady(t, c)
	req := bucketRequest("replay-once", 5)
	ch := checkAsync(context.Background(), c, req)
	testkit.WaitFor(t, "first attempt decided by the node", func() bool { return cl.servers[0].Stats().Requests == 1 })
	testkit.WaitFor(t, "answer dropped", func() bool { return relay.dropAnswers.Load() == 0 })
	clk.Advance(u) // no answer at U: replay
	r := await(t, ch)
	if r.err != nil || r.d.Cause != CauseAllow || r.d.Attempts != 2 {
		t.Fatalf("err %v decision %+v", r.err, r.d)
	}
	if r.d.Resources[0].Remaining != 4 {
		t.Errorf("remaining after replay = %d, want 4 (one token consumed)", r.d.Resources[0].Remaining)
	}
	st := cl.servers[0].Stats()
	if st.Requests != 1 || st.Replays != 1 {
		t.Errorf("server requests %d replays %d, want 1 and 1", st.Requests, st.Replays)
	}
	var dec Decision
	if err := c.Check(context.Background(), req, &dec); err != nil || dec.Resources[0].Remaining != 3 {
		t.Fatalf("next check: err %v decision %+v", err, dec)
	}
}

func TestClusterCompletionReachesNodeThatMissedRequest(t *testing.T) {
	cl := startCluster(t, 3, nil)
	cl.ctl[2].dropRequests.Store(true)
	c := newTestClient(t, cl.dns.Addr(), clientOpts{})
	waitReady(t, c)
	req := bucketRequest("completion", 10)
	var dec Decision
	if err := c.Check(context.Background(), req, &dec); err != nil || dec.Cause != CauseAllow {
		t.Fatalf("err %v decision %+v", err, dec)
	}
	testkit.WaitFor(t, "completion applied", func() bool { return cl.servers[2].Stats().CompletionsApplied == 1 })
	// The node that missed the request applied the decision: its bucket
	// has one token less, like the others'.
	cl.ctl[2].dropRequests.Store(false)
	cl.ctl[0].dropRequests.Store(true)
	cl.ctl[1].dropRequests.Store(true)
	if err := c.Check(context.Background(), req, &dec); err != nil || dec.Endpoint != "n3.rl.test." || dec.Resources[0].Remaining != 8 {
		t.Fatalf("second check from node 3: err %v decision %+v", err, dec)
	}
	// single_round has no completion delivery.
	sr := newTestClient(t, cl.dns.Addr(), clientOpts{policy: ratelimitly.SingleRound(50 * time.Millisecond)})
	waitReady(t, sr)
	cl.ctl[0].dropRequests.Store(false)
	cl.ctl[2].dropRequests.Store(true)
	before := cl.servers[2].Stats().Completions
	if err := sr.Check(context.Background(), req, &dec); err != nil {
		t.Fatal(err)
	}
	if st := sr.Stats(); st.Completions != 0 {
		t.Errorf("single_round sent %d completions", st.Completions)
	}
	if cl.servers[2].Stats().Completions != before {
		t.Error("completion reached a node under single_round")
	}
}

func TestClusterSteeringRebinds(t *testing.T) {
	cl := startCluster(t, 3, nil)
	c := newTestClient(t, cl.dns.Addr(), clientOpts{shards: 1})
	waitReady(t, c)
	before := c.ring.LocalAddr(0)
	cl.ctl[1].steer.Store(true)
	var dec Decision
	for i := 0; i < 20; i++ {
		if err := c.Check(context.Background(), testRequest(), &dec); err != nil {
			t.Fatalf("check %d during steering: %v", i, err)
		}
	}
	testkit.WaitFor(t, "rebind", func() bool { return c.Stats().Ring.Rebinds >= 1 })
	cl.ctl[1].steer.Store(false)
	for i := 0; i < 20; i++ {
		if err := c.Check(context.Background(), testRequest(), &dec); err != nil {
			t.Fatalf("check %d after steering: %v", i, err)
		}
	}
	if c.ring.LocalAddr(0) == before {
		t.Error("source port did not change")
	}
	if st := cl.servers[1].Stats(); st.Steered == 0 {
		t.Error("server never steered")
	}
	testkit.WaitFor(t, "old sockets retired", func() bool { st := c.Stats().Ring; return st.Sockets == 1 && st.Retired == st.Rebinds })
}

func TestClusterMembershipChangeAfterTTL(t *testing.T) {
	clk := newManualClock(time.Now())
	cl := startCluster(t, 3, clk)
	cl.dns.SetTTL(8, 8)
	cl.dns.SetSRV(testSRV, targetsFor(cl.servers[0].Addr(), cl.servers[1].Addr())...)
	c := newTestClient(t, cl.dns.Addr(), clientOpts{clock: clk})
	waitReady(t, c)
	cl.dns.SetSRV(testSRV, targetsFor(cl.servers[0].Addr(), cl.servers[1].Addr(), cl.servers[2].Addr())...)
	clk.Advance(8 * time.Second)
	testkit.WaitFor(t, "third endpoint", func() bool { // see TestClusterDNSFailureAfterStartUsesLastKnownGood
		if c.Stats().Endpoints == 3 {
			return true
		}
		clk.Advance(time.Second)
		return false
	})
	var dec Decision
	if err := c.Check(context.Background(), testRequest(), &dec); err != nil {
		t.Fatal(err)
	}
	testkit.WaitFor(t, "node 3 used", func() bool { st := cl.servers[2].Stats(); return st.Requests+st.Completions > 0 })
}

func TestClusterDNSFailureAfterStartUsesLastKnownGood(t *testing.T) {
	clk := newManualClock(time.Now())
	cl := startCluster(t, 3, clk)
	cl.dns.SetTTL(5, 5)
	c := newTestClient(t, cl.dns.Addr(), clientOpts{clock: clk})
	waitReady(t, c)
	cl.dns.SetMode(dnstest.ModeServFail)
	clk.Advance(5 * time.Second)
	// The discovery goroutine arms its refresh timer after Ready turns
	// true: an Advance that came first leaves that timer a TTL ahead, so
	// keep the clock moving until the refresh ran.
	testkit.WaitFor(t, "failed refresh", func() bool {
		if c.Stats().LookupFailures >= 1 {
			return true
		}
		clk.Advance(time.Second)
		return false
	})
	var dec Decision
	if err := c.Check(context.Background(), testRequest(), &dec); err != nil || !dec.Cause.Decided() {
		t.Fatalf("err %v decision %+v", err, dec)
	}
}

func TestClusterDNSFailureAtStart(t *testing.T) {
	cl := startCluster(t, 3, nil)
	cl.dns.SetMode(dnstest.ModeNXDomain)
	c := newTestClient(t, cl.dns.Addr(), clientOpts{})
	testkit.WaitFor(t, "failed lookup", func() bool { return c.Stats().LookupFailures >= 1 })
	var dec Decision
	if err := c.Check(context.Background(), testRequest(), &dec); err != ErrNoEndpoints || dec.Cause != CauseNoEndpoints {
		t.Fatalf("err %v decision %+v", err, dec)
	}
	// Recovery once DNS answers.
	cl.dns.SetMode(dnstest.ModeOK)
	waitReady(t, c)
	if err := c.Check(context.Background(), testRequest(), &dec); err != nil {
		t.Fatal(err)
	}
}

func TestClusterDnsmasq(t *testing.T) {
	var targets []dnstest.Target
	for i := 0; i < 3; i++ {
		s, err := rlserver.Start(rlserver.Config{Listen: "127.0.0.1:0", Credentials: []credentials.Credential{testCred()}, Workers: 1})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		targets = append(targets, dnstest.Target{Name: fmt.Sprintf("node%d.rl.test", i), Port: s.Addr().Port(), Addrs: []netip.Addr{s.Addr().Addr()}})
	}
	dm := dnstest.StartDnsmasq(t, testSRV, 30, targets...)
	c := newTestClient(t, dm.Addr, clientOpts{})
	waitReady(t, c)
	if n := len(c.Endpoints()); n != 3 {
		t.Fatalf("endpoints from dnsmasq: %d", n)
	}
	req := bucketRequest("dnsmasq", 2)
	var dec Decision
	for i, want := range []Cause{CauseAllow, CauseAllow, ratelimitly.CauseDenyResource} {
		if err := c.Check(context.Background(), req, &dec); err != nil || dec.Cause != want {
			t.Fatalf("check %d: err %v cause %v, want %v", i, err, dec.Cause, want)
		}
	}
}
