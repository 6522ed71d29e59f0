package rlclient

import (
	"context"
	"fmt"
	"log/slog"
	"math/bits"
	"net"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/rl-tproxy/rl-tproxy/internal/dnstest"
	"github.com/rl-tproxy/rl-tproxy/internal/testkit"
	"github.com/rl-tproxy/rl-tproxy/internal/testkit/rlcluster"
	"github.com/rl-tproxy/rl-tproxy/pkg/ratelimitly"
	"github.com/rl-tproxy/rl-tproxy/pkg/ratelimitly/credentials"
	"github.com/rl-tproxy/rl-tproxy/pkg/ratelimitly/wire"
)

const testSRV = "_ratelimitly._udp.rl.test"

func testCred() credentials.Credential {
	c := credentials.Credential{Tenant: "tenant-a", KeyID: 7}
	for i := range c.Secret {
		c.Secret[i] = byte(i*7 + 1)
	}
	return c
}

func wrongCred() credentials.Credential {
	c := testCred()
	c.Secret[0] ^= 0xff
	return c
}

// seenDgram is what a fake node received.
type seenDgram struct {
	kind     wire.Kind
	id       uint64
	attempt  uint8
	replay   bool
	decision uint8
	probe    bool // a RATE_REQUEST whose only guard is ProbeService
	from     netip.AddrPort
}

// fakeNode is a scripted RateLimitly peer built on the wire codec. It lets
// the engine tests produce answers rlserver never would (wrong key, bad
// echo) and observe every datagram.
type fakeNode struct {
	conn  *net.UDPConn
	open  *wire.Key
	seal  *wire.Key
	epoch uint64

	mu          sync.Mutex
	deny        bool
	drop        bool
	steer       bool
	extraGuards int
	status      uint8
	fixAt       uint8          // when > 0: answer attempts >= fixAt correctly (status OK, exact cardinality)
	replyTo     netip.AddrPort // answer here instead of to the sender (if set)
	seen        []seenDgram
	notify      chan struct{}
}

func startFakeNode(t testing.TB, epoch uint64, sealWith credentials.Credential) *fakeNode {
	t.Helper()
	n, err := startFakeNodeAt(t, netip.MustParseAddrPort("127.0.0.1:0"), epoch, sealWith)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// startFakeNodeAt starts a fake node listening on at.
func startFakeNodeAt(t testing.TB, at netip.AddrPort, epoch uint64, sealWith credentials.Credential) (*fakeNode, error) {
	t.Helper()
	conn, err := net.ListenUDP("udp", net.UDPAddrFromAddrPort(at))
	if err != nil {
		return nil, err
	}
	c := testCred()
	open, _ := wire.NewKey(c.KeyID, c.Secret)
	seal, _ := wire.NewKey(sealWith.KeyID, sealWith.Secret)
	n := &fakeNode{conn: conn, open: open, seal: seal, epoch: epoch, notify: make(chan struct{}, 1)}
	done := make(chan struct{})
	go func() { defer close(done); n.serve() }()
	t.Cleanup(func() { conn.Close(); <-done })
	return n, nil
}

func (n *fakeNode) addr() netip.AddrPort { return n.conn.LocalAddr().(*net.UDPAddr).AddrPort() }

func (n *fakeNode) set(f func(n *fakeNode)) {
	n.mu.Lock()
	f(n)
	n.mu.Unlock()
}

func (n *fakeNode) received() []seenDgram {
	n.mu.Lock()
	defer n.mu.Unlock()
	return append([]seenDgram(nil), n.seen...)
}

func (n *fakeNode) count(kind wire.Kind) int {
	k := 0
	for _, s := range n.received() {
		if s.kind == kind {
			k++
		}
	}
	return k
}

func (n *fakeNode) serve() {
	buf := make([]byte, 2048)
	out := make([]byte, 0, wire.MaxDatagram)
	var h wire.Header
	var req wire.RateRequest
	var comp wire.Completion
	var rep wire.LatencyReport
	for {
		k, from, err := n.conn.ReadFromUDPAddrPort(buf)
		if err != nil {
			return
		}
		pt, err := n.open.Open(buf[:k], &h)
		if err != nil {
			continue
		}
		if wire.DecodeBody(h.Kind, pt, &req, nil, &rep, &comp) != nil {
			continue
		}
		n.mu.Lock()
		s := seenDgram{kind: h.Kind, id: h.RequestID, attempt: h.Attempt, replay: h.Replay(), from: from}
		if h.Kind == wire.KindCompletion {
			s.decision = comp.Decision
		}
		s.probe = h.Kind == wire.KindRateRequest && len(req.Resources) == 0 && len(req.Guards) == 1 &&
			string(req.Guards[0].Service) == ProbeService
		n.seen = append(n.seen, s)
		drop, deny, steer, extra, status := n.drop, n.deny, n.steer, n.extraGuards, n.status
		if n.fixAt > 0 && h.Attempt >= n.fixAt {
			extra, status = 0, wire.StatusOK
		}
		if n.replyTo.IsValid() {
			from = n.replyTo
		}
		n.mu.Unlock()
		select {
		case n.notify <- struct{}{}:
		default:
		}
		if h.Kind != wire.KindRateRequest || drop {
			continue
		}
		resp := wire.RateResponse{Status: status, Success: !deny, ServerEpoch: n.epoch}
		for range len(req.Guards) + extra {
			resp.Guards = append(resp.Guards, wire.GuardResult{Passed: true, ObservedMs: 3})
		}
		for range req.Resources {
			rr := wire.ResourceResult{Remaining: 5}
			if deny {
				rr = wire.ResourceResult{TokensDeficit: 1, RetryAfterMs: 250}
			}
			resp.Resources = append(resp.Resources, rr)
		}
		rh := wire.Header{Flags: h.Flags & wire.FlagReplay, Attempt: h.Attempt, TTLms: h.TTLms, RequestID: h.RequestID,
			Timestamp: uint64(time.Now().UnixMilli())}
		if !steer {
			rh.Flags |= wire.FlagSteering
		}
		pkt, err := n.seal.Seal(out[:0], &rh, &resp)
		if err != nil {
			continue
		}
		n.conn.WriteToUDPAddrPort(pkt, from)
	}
}

// targetsFor builds SRV targets (n1.rl.test., n2.rl.test., ...) for addresses.
func targetsFor(addrs ...netip.AddrPort) []dnstest.Target {
	return rlcluster.Targets("rl.test", addrs...)
}

type clientOpts struct {
	policy  ratelimitly.RequestPolicy
	clock   Clock
	cred    credentials.Credential
	shards  int
	loops   int  // Config.LoopShards
	anyBind bool // bind the wildcard address (both families) instead of 127.0.0.1
	log     *slog.Logger
}

func newTestClient(t testing.TB, dnsAddr string, o clientOpts) *Client {
	t.Helper()
	if o.cred == (credentials.Credential{}) {
		o.cred = testCred()
	}
	if o.shards == 0 {
		o.shards = 2
	}
	if o.policy.Name == "" {
		// Real-clock tests decide early; a generous unit keeps a loaded CI
		// machine from turning a slow answer into a timeout.
		o.policy = ratelimitly.Standard(2 * time.Second)
	}
	bind := netip.MustParseAddr("127.0.0.1")
	if o.anyBind {
		bind = netip.Addr{}
	}
	c, err := New(Config{SRV: testSRV, Resolver: dnsAddr, ResolverTimeout: time.Second, Credential: o.cred,
		Policy: o.policy, Bind: bind, Shards: o.shards, LoopShards: o.loops, Clock: o.clock, Logger: o.log})
	if err != nil {
		t.Fatalf("new client: %v", err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func waitReady(t testing.TB, c *Client) {
	t.Helper()
	testkit.WaitFor(t, "discovery", c.Ready)
}

func testRequest() *wire.RateRequest {
	return &wire.RateRequest{
		Label:     []byte("GET /api"),
		Guards:    []wire.Guard{{Service: []byte("svc-a"), ThresholdMs: 500}},
		Resources: []wire.Resource{{Bucket: []byte("tenant-a:/api"), Rate: 1000, PeriodMs: 1000, Cost: 1}},
	}
}

type checkResult struct {
	d   Decision
	err error
}

// checkAsync runs Check in a goroutine and returns its result channel.
func checkAsync(ctx context.Context, c *Client, req *wire.RateRequest) <-chan checkResult {
	ch := make(chan checkResult, 1)
	go func() {
		var d Decision
		err := c.Check(ctx, req, &d)
		ch <- checkResult{d, err}
	}()
	return ch
}

func await(t testing.TB, ch <-chan checkResult) checkResult {
	t.Helper()
	select {
	case r := <-ch:
		return r
	case <-time.After(20 * time.Second):
		t.Fatal("check did not return")
		return checkResult{}
	}
}

// assertPending fails if the check already returned.
func assertPending(t testing.TB, ch <-chan checkResult, when string) {
	t.Helper()
	select {
	case r := <-ch:
		t.Fatalf("%s: check returned early: cause %v err %v", when, r.d.Cause, r.err)
	default:
	}
}

// waitValid waits until the single live request holds n valid answers.
func waitValid(t testing.TB, c *Client, n int) {
	t.Helper()
	testkit.WaitFor(t, fmt.Sprintf("%d valid answers", n), func() bool {
		for i := range c.table.stripes {
			st := &c.table.stripes[i]
			st.mu.Lock()
			found := false
			st.each(func(r *request) {
				r.mu.Lock()
				found = found || bits.OnesCount64(r.valid) >= n
				r.mu.Unlock()
			})
			st.mu.Unlock()
			if found {
				return true
			}
		}
		return false
	})
}

// waitAnswered waits until the single live request has an answer (valid
// or not) from n endpoints for its latest send.
func waitAnswered(t testing.TB, c *Client, n int) {
	t.Helper()
	testkit.WaitFor(t, fmt.Sprintf("%d answers", n), func() bool {
		for i := range c.table.stripes {
			st := &c.table.stripes[i]
			st.mu.Lock()
			found := false
			st.each(func(r *request) {
				r.mu.Lock()
				found = found || bits.OnesCount64(r.answered) >= n
				r.mu.Unlock()
			})
			st.mu.Unlock()
			if found {
				return true
			}
		}
		return false
	})
}
