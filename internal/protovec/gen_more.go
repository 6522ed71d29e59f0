package protovec

import (
	"github.com/rl-tproxy/rl-tproxy/pkg/ratelimitly/wire"
)

// completion covers §6.5's remembered answers and §6.4's shared id space:
// the guard results an applied allow COMPLETION remembers, and a
// COMPLETION whose id is a report's.
func (g *gen) completion() Vector {
	body := enc(&wire.RateRequest{
		Guards:    []wire.Guard{{Service: []byte("slow"), ThresholdMs: 100}},
		Resources: []wire.Resource{res("c", 1, 3_600_000, 5, 1)},
	})
	comp := func(dec uint8) []byte { return append([]byte{dec}, body...) }
	rep := enc(&wire.LatencyReport{Entries: []wire.ReportEntry{{Service: []byte("slow"), DurationMs: 900}}})
	const r, a, dn = 0x1100, 0x1200, 0x1300
	guardResp := func(success, passed bool, rs ...wire.ResourceResult) *wire.RateResponse {
		return &wire.RateResponse{Status: wire.StatusOK, Success: success, ServerEpoch: Epoch,
			Guards: []wire.GuardResult{{Passed: passed, ObservedMs: 900}}, Resources: rs}
	}
	steps := []Step{
		g.step("a 900 ms report for tracker slow (id R): the estimate is 900", T0, dg{kind: wire.KindLatencyReport, id: r, body: rep}, nil),
		g.step("a COMPLETION allow for unseen id A with a guard on slow (threshold 100): applied; the guard is not evaluated, 1 token taken", T0,
			dg{kind: wire.KindCompletion, id: a, body: comp(wire.DecisionAllow)}, nil),
		g.step("a RATE_REQUEST of A gets the remembered answer: success 1, the guard passed = 1 with observed_ms the estimate (900), remaining 4; nothing more consumed", T0,
			dg{kind: wire.KindRateRequest, id: a, body: body}, guardResp(true, true, rr(4, 0, 0))),
		g.step("a COMPLETION deny for unseen id D: evaluated now, nothing consumed: the guard fails (900 > 100)", T0,
			dg{kind: wire.KindCompletion, id: dn, body: comp(wire.DecisionDeny)}, nil),
		g.step("a RATE_REQUEST of D gets success 0 with the guard as evaluated (passed 0, observed 900), remaining 4", T0,
			dg{kind: wire.KindRateRequest, id: dn, body: body}, guardResp(false, false, rr(4, 0, 0))),
		g.step("a COMPLETION allow whose id is report R's: the id is remembered (a report's), so the completion is ignored: nothing consumed", T0,
			dg{kind: wire.KindCompletion, id: r, body: comp(wire.DecisionAllow)}, nil),
		g.step("a fresh request: 4 tokens (only A's completion took one)", T0,
			dg{kind: wire.KindRateRequest, id: 0x1400, body: req(res("c", 1, 3_600_000, 5, 0))}, ok(true, rr(4, 0, 0))),
	}
	return serverVector("completion", "docs/protocol.md §6.4 and §6.5: what an applied COMPLETION remembers, and a COMPLETION with a report's id.", steps,
		BucketState{Tenant: Tenant, Bucket: "c", Tokens: 4})
}

// retention covers §6.4: a dropped datagram does not extend an id's
// retention, and ids are remembered per key_id (two keys of one tenant
// share buckets but not ids).
func (g *gen) retention() Vector {
	b := req(res("r", 1, 3_600_000, 5, 1))
	const x = 0x2100
	trailing := append(append([]byte(nil), b...), 0)
	other := dg{key: g.keys[HorizKey], kind: wire.KindRateRequest, id: x, body: b}
	otherAns := func(at uint64, resp *wire.RateResponse) Step {
		s := g.step("the same request_id X under key_id 43 (same tenant): not remembered for that key: decided, 1 token taken (buckets are per tenant)", at, other, resp)
		s.Answer.KeyID = HorizKey
		return s
	}
	steps := []Step{
		g.step("request X at t=0 (ttl_ms 60): allowed, 4 left; X is kept until 0+60+30000", T0,
			dg{kind: wire.KindRateRequest, id: x, body: b}, ok(true, rr(4, 0, 0))),
		otherAns(T0, ok(true, rr(3, 0, 0))),
		g.drop("t=30000: a RATE_REQUEST of X with a trailing byte after its body, stamped 30000: dropped (malformed) before the dedup step, so it does not extend X", T0+30_000,
			g.seal(dg{kind: wire.KindRateRequest, id: x, attempt: 1, flags: flagR, ts: T0 + 30_000, body: trailing}), "malformed"),
		g.drop("t=30000: a replay of X with ttl_ms 200 under key 43 (max_horizon 100): dropped (horizon), no extension either", T0+30_000,
			g.seal(dg{key: g.keys[HorizKey], kind: wire.KindRateRequest, id: x, attempt: 1, flags: flagR, ttl: 200, ts: T0 + 30_000, body: b}), "horizon"),
		g.step("t=30061: X expired at 30060 (only accepted datagrams extend it): a replay stamped 30001 is decided again and consumes (2 left)", T0+30_061,
			dg{kind: wire.KindRateRequest, id: x, attempt: 1, flags: flagR, ts: T0 + 30_001, body: b}, ok(true, rr(2, 0, 0))),
	}
	return serverVector("retention", "docs/protocol.md §6.4: what extends an id's retention, and the scope of an id (per key_id).", steps,
		BucketState{Tenant: Tenant, Bucket: "r", Tokens: 2 + 30_061.0/3_600_000}) // refilled for 30061 ms at 1 per hour
}

// repeatedBucket covers §6.3: a bucket named by several resources of one
// request, when an earlier one is short.
func (g *gen) repeatedBucket() Vector {
	three := req(res("rep", 1, 3_600_000, 3, 4), res("rep", 1, 3_600_000, 3, 2), res("rep", 1, 3_600_000, 3, 2))
	steps := []Step{
		g.step("bucket rep (burst 3, full) named three times, costs 4, 2, 2: the first sees 3 (short, deficit 1; its cost is not subtracted), "+
			"the second sees 3 (fits: 1 left for the rest), the third sees 1 (short, deficit 1); deny, nothing consumed, every remaining 3", T0,
			dg{kind: wire.KindRateRequest, id: 0x3100, body: three},
			ok(false, rr(3, 1, 3_600_000), rr(3, 0, 0), rr(3, 1, 3_600_000))),
		g.step("costs 1, 4, 1 at t=0: the first fits (2 left), the second sees 2 (short, deficit 2, retry 2 h), the third sees 2 (fits); deny", T0,
			dg{kind: wire.KindRateRequest, id: 0x3200, body: req(res("rep", 1, 3_600_000, 3, 1), res("rep", 1, 3_600_000, 3, 4), res("rep", 1, 3_600_000, 3, 1))},
			ok(false, rr(3, 0, 0), rr(3, 2, 7_200_000), rr(3, 0, 0))),
	}
	return serverVector("repeated-bucket", "docs/protocol.md §6.3: a bucket named by several resources of one request sees only the earlier costs that fit.", steps,
		BucketState{Tenant: Tenant, Bucket: "rep", Tokens: 3})
}
