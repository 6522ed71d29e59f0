package rlclient

import (
	"context"
	"testing"
	"time"

	"github.com/rl-tproxy/rl-tproxy/internal/testkit"
	"github.com/rl-tproxy/rl-tproxy/pkg/ratelimitly"
	"github.com/rl-tproxy/rl-tproxy/pkg/ratelimitly/wire"
)

// invalidAnswers are the answers that are not valid: the server answered,
// but it is still missing a valid answer.
var invalidAnswers = []struct {
	name  string
	set   func(n *fakeNode)
	cause Cause
	err   error
}{
	{"status UNAVAILABLE", func(n *fakeNode) { n.status = wire.StatusUnavailable }, CauseProtocol, ErrProtocol},
	{"status OVER_QUOTA", func(n *fakeNode) { n.status = wire.StatusOverQuota }, CauseProtocol, ErrProtocol},
	{"status MALFORMED", func(n *fakeNode) { n.status = wire.StatusMalformed }, CauseProtocol, ErrProtocol},
	{"wrong cardinality", func(n *fakeNode) { n.extraGuards = 1 }, CauseCardinality, ErrCardinality},
}

// TestInvalidAnswerGetsReplayAndCompletion: a server that answers, but
// not validly, is still missing: it gets the replay at U and, once another
// server's valid answer decided, the completion.
func TestInvalidAnswerGetsReplayAndCompletion(t *testing.T) {
	for _, tc := range invalidAnswers {
		t.Run(tc.name, func(t *testing.T) {
			d, nodes := fakeCluster(t, 2)
			bad, late := nodes[0], nodes[1]
			bad.set(tc.set)
			late.set(tc.set)
			late.set(func(n *fakeNode) { n.fixAt = 1 }) // answers the replay validly
			clk := newManualClock(time.Now())
			u := 20 * time.Millisecond
			c := newTestClient(t, d.Addr(), clientOpts{clock: clk, policy: ratelimitly.Standard(u)})
			waitReady(t, c)
			ch := checkAsync(context.Background(), c, testRequest())
			waitAnswered(t, c, 2)
			assertPending(t, ch, "every server answered invalidly before U")
			clk.Advance(u)
			r := await(t, ch)
			if r.err != nil || r.d.Cause != CauseAllow || r.d.Attempts != 2 || r.d.Endpoint != "n2.rl.test." {
				t.Fatalf("err %v decision %+v, want allow from n2 after one replay", r.err, r.d)
			}
			// The replays go out together; the check may be decided by n2's
			// answer before n1 has read its copy: wait for both to arrive.
			testkit.WaitFor(t, "the replay at both servers", func() bool {
				return bad.count(wire.KindRateRequest) >= 2 && late.count(wire.KindRateRequest) >= 2
			})
			for i, n := range nodes {
				rs := n.received()
				if len(rs) < 2 || rs[0].attempt != 0 || rs[1].attempt != 1 || !rs[1].replay || rs[1].id != rs[0].id {
					t.Fatalf("node %d: want the request and its replay, got %+v", i+1, rs)
				}
			}
			testkit.WaitFor(t, "completion to the invalid server", func() bool { return bad.count(wire.KindCompletion) == 1 })
			rs := bad.received()
			if last := rs[len(rs)-1]; last.kind != wire.KindCompletion || last.decision != wire.DecisionAllow || last.id != rs[0].id {
				t.Errorf("completion %+v", last)
			}
			if late.count(wire.KindCompletion) != 0 {
				t.Error("completion sent to the server whose valid answer decided")
			}
		})
	}
}

// TestAllInvalidFailsAfterReplay: when every server answers invalidly,
// the check replays at U (not fails at once) and fails with the specific
// cause once the replays are answered the same way; no completion.
func TestAllInvalidFailsAfterReplay(t *testing.T) {
	for _, tc := range invalidAnswers {
		t.Run(tc.name, func(t *testing.T) {
			d, nodes := fakeCluster(t, 2)
			for _, n := range nodes {
				n.set(tc.set)
			}
			clk := newManualClock(time.Now())
			u := 20 * time.Millisecond
			c := newTestClient(t, d.Addr(), clientOpts{clock: clk, policy: ratelimitly.Standard(u)})
			waitReady(t, c)
			ch := checkAsync(context.Background(), c, testRequest())
			waitAnswered(t, c, 2)
			assertPending(t, ch, "before U")
			clk.Advance(u)
			r := await(t, ch)
			if r.err != tc.err || r.d.Cause != tc.cause || r.d.Attempts != 2 || r.d.Allow {
				t.Fatalf("err %v decision %+v, want %v after one replay", r.err, r.d, tc.cause)
			}
			if got := allCount(nodes, wire.KindRateRequest); got != 4 {
				t.Errorf("requests = %d, want 4 (request + replay to each)", got)
			}
			if allCount(nodes, wire.KindCompletion) != 0 {
				t.Error("completion without a decision")
			}
		})
	}
}

// TestInvalidAnswerBesideValidDecides: one valid answer decides as soon
// as every server answered; the invalid one gets the completion.
func TestInvalidAnswerBesideValidDecides(t *testing.T) {
	for _, tc := range invalidAnswers {
		t.Run(tc.name, func(t *testing.T) {
			d, nodes := fakeCluster(t, 2)
			nodes[0].set(tc.set)
			c := newTestClient(t, d.Addr(), clientOpts{clock: newManualClock(time.Now()), policy: ratelimitly.Standard(20 * time.Millisecond)})
			waitReady(t, c)
			var dec Decision
			for i := 0; i < 3; i++ {
				if err := c.Check(context.Background(), testRequest(), &dec); err != nil || dec.Endpoint != "n2.rl.test." || dec.Attempts != 1 {
					t.Fatalf("check %d: err %v decision %+v", i, err, dec)
				}
			}
			testkit.WaitFor(t, "completions", func() bool { return nodes[0].count(wire.KindCompletion) == 3 })
		})
	}
}
