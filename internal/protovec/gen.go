package protovec

import (
	"encoding/binary"
	"encoding/hex"
	"fmt"

	"github.com/rl-tproxy/rl-tproxy/pkg/ratelimitly/wire"
)

// The vectors' clock and keys (the keys of docs/protocol.md §13).
const (
	T0       = 1767225600000 // 2026-01-01T00:00:00Z, unix ms
	Epoch    = 1767222000000 // the server started an hour earlier
	KeyID    = 42
	HorizKey = 43 // a key with max_horizon 100 ms
	Tenant   = "t"
	skewMs   = 30_000
	flagS    = wire.FlagSteering
	flagR    = wire.FlagReplay
)

func secret(fill byte) [32]byte {
	var s [32]byte
	for i := range s {
		s[i] = fill + byte(i)
	}
	return s
}

// gen seals datagrams with deterministic nonces (the vectors must be
// reproducible; real senders use random nonces).
type gen struct {
	keys  map[uint32]*wire.Key
	wrong *wire.Key // key id 42 with another secret
	n     uint64
}

func newGen() *gen {
	g := &gen{keys: map[uint32]*wire.Key{}}
	g.keys[KeyID], _ = wire.NewKey(KeyID, secret(0))
	g.keys[HorizKey], _ = wire.NewKey(HorizKey, secret(0x40))
	g.wrong, _ = wire.NewKey(KeyID, secret(0x80))
	return g
}

func creds() []Credential {
	s0, s1 := secret(0), secret(0x40)
	return []Credential{
		{Tenant: Tenant, KeyID: KeyID, SecretHex: hex.EncodeToString(s0[:])},
		{Tenant: Tenant, KeyID: HorizKey, SecretHex: hex.EncodeToString(s1[:]), MaxHorizonMs: 100},
	}
}

// dg is one datagram to seal.
type dg struct {
	key     *wire.Key // nil = key 42
	kind    wire.Kind
	flags   uint8
	attempt uint8
	ttl     uint16 // 0 = 60
	id      uint64
	ts      uint64
	body    []byte
}

func (g *gen) seal(d dg) []byte {
	g.n++
	k := d.key
	if k == nil {
		k = g.keys[KeyID]
	}
	if d.ttl == 0 {
		d.ttl = 60
	}
	h := wire.Header{Kind: d.kind, Flags: d.flags, Attempt: d.attempt, TTLms: d.ttl, RequestID: d.id, Timestamp: d.ts}
	binary.BigEndian.PutUint64(h.Nonce[:8], 0x70726f746f766563) // "protovec"
	binary.BigEndian.PutUint64(h.Nonce[16:], g.n)
	pkt, err := k.SealBody(nil, &h, d.body)
	if err != nil {
		panic(fmt.Sprintf("protovec: seal: %v", err)) // generator input is code, not data
	}
	return pkt
}

func enc(b wire.Body) []byte {
	out, err := b.AppendBody(nil)
	if err != nil {
		panic(fmt.Sprintf("protovec: encode %T: %v", b, err))
	}
	return out
}

func idHex(id uint64) string { return fmt.Sprintf("%016x", id) }

func res(bucket string, rate, period, burst, cost uint32) wire.Resource {
	return wire.Resource{Bucket: []byte(bucket), Rate: rate, PeriodMs: period, Burst: burst, Cost: cost}
}

func req(rs ...wire.Resource) []byte { return enc(&wire.RateRequest{Resources: rs}) }

func ok(success bool, rs ...wire.ResourceResult) *wire.RateResponse {
	return &wire.RateResponse{Status: wire.StatusOK, Success: success, ServerEpoch: Epoch, Resources: rs}
}

func rr(remaining, deficit, retry uint32) wire.ResourceResult {
	return wire.ResourceResult{Remaining: remaining, TokensDeficit: deficit, RetryAfterMs: retry}
}

// answer is the expected answer to a request datagram d at server time at.
func answer(d dg, at uint64, resp *wire.RateResponse) *Answer {
	ttl := d.ttl
	if ttl == 0 {
		ttl = 60
	}
	return &Answer{Flags: flagS | d.flags&flagR, Attempt: d.attempt, TTLms: ttl, KeyID: KeyID, RequestID: idHex(d.id),
		TimestampMs: at, BodyHex: hex.EncodeToString(enc(resp))}
}

func (g *gen) step(comment string, at uint64, d dg, resp *wire.RateResponse) Step {
	if d.ts == 0 {
		d.ts = at
	}
	s := Step{Comment: comment, AtMs: at, DatagramHex: hex.EncodeToString(g.seal(d))}
	switch {
	case resp != nil:
		s.Expect, s.Answer = "answer", answer(d, at, resp)
	default:
		s.Expect = "none"
	}
	return s
}

func (g *gen) raw(comment string, at uint64, pkt []byte, expect string) Step {
	return Step{Comment: comment, AtMs: at, DatagramHex: hex.EncodeToString(pkt), Expect: expect}
}

func (g *gen) drop(comment string, at uint64, pkt []byte, reason string) Step {
	return Step{Comment: comment, AtMs: at, DatagramHex: hex.EncodeToString(pkt), Expect: "drop", DropReason: reason}
}

// Generate builds every vector, keyed by file name.
func Generate() map[string]Vector {
	g := newGen()
	return map[string]Vector{
		"server-token-bucket.json":    g.tokenBucket(),
		"server-dedup.json":           g.dedup(),
		"server-drops.json":           g.drops(),
		"server-edge-values.json":     g.edgeValues(),
		"client-answers.json":         g.clientAnswers(),
		"server-completion.json":      g.completion(),
		"server-retention.json":       g.retention(),
		"server-repeated-bucket.json": g.repeatedBucket(),
	}
}

func serverVector(name, desc string, steps []Step, buckets ...BucketState) Vector {
	return Vector{Name: name, Description: desc, Role: "server", Credentials: creds(), ServerStartMs: Epoch,
		Steps: steps, StateAfter: &State{Buckets: buckets}}
}

// tokenBucket is §10's worked numbers: rate 5 per 1000 ms, burst 5, cost 1.
func (g *gen) tokenBucket() Vector {
	b := req(res("b", 5, 1000, 5, 1))
	var steps []Step
	for i := uint64(1); i <= 5; i++ {
		steps = append(steps, g.step(fmt.Sprintf("request %d at t=0: allowed, %d left", i, 5-i), T0,
			dg{kind: wire.KindRateRequest, id: i << 8, body: b}, ok(true, rr(uint32(5-i), 0, 0))))
	}
	steps = append(steps,
		g.step("request 6 at t=0: bucket empty: deny, deficit 1, retry ceil(1*1000/5) = 200", T0,
			dg{kind: wire.KindRateRequest, id: 6 << 8, body: b}, ok(false, rr(0, 1, 200))),
		g.step("t=100 ms: 0.5 tokens: deny, deficit ceil(0.5) = 1, retry ceil(0.5*200) = 100", T0+100,
			dg{kind: wire.KindRateRequest, id: 7 << 8, body: b}, ok(false, rr(0, 1, 100))),
		g.step("t=200 ms: 1 token: allow, 0 left", T0+200,
			dg{kind: wire.KindRateRequest, id: 8 << 8, body: b}, ok(true, rr(0, 0, 0))),
	)
	return serverVector("token-bucket", "docs/protocol.md §6.1, §6.3 and §10: a new bucket is full, refill is continuous, deny consumes nothing.",
		steps, BucketState{Tenant: Tenant, Bucket: "b", Tokens: 0})
}

// dedup covers §6.4 and §6.5: identical answers to replays, report ids,
// completions, MALFORMED answers remembered, retention extended by later
// datagrams of an id.
func (g *gen) dedup() Vector {
	b := req(res("d", 1, 3_600_000, 5, 1))
	const a, r, c, dn, m = 0xa00, 0xb00, 0xc00, 0xd00, 0xe00
	first := dg{kind: wire.KindRateRequest, id: a, body: b}
	rep := enc(&wire.LatencyReport{Entries: []wire.ReportEntry{{Service: []byte("svc"), DurationMs: 10}}})
	comp := func(dec uint8) []byte { return append([]byte{dec}, b...) }
	mal := req(res("m", 0, 1000, 0, 1))
	lateComp := g.seal(dg{kind: wire.KindCompletion, id: a, ts: T0 + 30_070, body: comp(wire.DecisionAllow)})
	steps := []Step{
		g.step("request A: allowed, 4 left", T0, first, ok(true, rr(4, 0, 0))),
		g.drop("a LATENCY_REPORT reusing decided id A is dropped", T0,
			g.seal(dg{kind: wire.KindLatencyReport, id: a, ts: T0, body: rep}), "replayed_report"),
		g.step("a LATENCY_REPORT with a fresh id R: accepted, never answered", T0, dg{kind: wire.KindLatencyReport, id: r, body: rep}, nil),
		g.drop("a RATE_REQUEST reusing report id R is dropped", T0,
			g.seal(dg{kind: wire.KindRateRequest, id: r, ts: T0, body: b}), "replayed_report"),
		g.step("a COMPLETION for seen id A is ignored (nothing consumed)", T0, dg{kind: wire.KindCompletion, id: a, body: comp(wire.DecisionAllow)}, nil),
		g.step("a COMPLETION allow for unseen id C: applied, 1 token taken", T0, dg{kind: wire.KindCompletion, id: c, body: comp(wire.DecisionAllow)}, nil),
		g.step("a late RATE_REQUEST of C gets the completion's answer (allow, 3 left) and consumes nothing", T0,
			dg{kind: wire.KindRateRequest, id: c, body: b}, ok(true, rr(3, 0, 0))),
		g.step("a COMPLETION deny for unseen id D: nothing consumed, id remembered", T0, dg{kind: wire.KindCompletion, id: dn, body: comp(wire.DecisionDeny)}, nil),
		g.step("a RATE_REQUEST of D gets success 0 computed at the completion (3 left, no deficit)", T0,
			dg{kind: wire.KindRateRequest, id: dn, body: b}, ok(false, rr(3, 0, 0))),
		g.step("rate 0: MALFORMED, empty arrays", T0, dg{kind: wire.KindRateRequest, id: m, body: mal},
			&wire.RateResponse{Status: wire.StatusMalformed, ServerEpoch: Epoch}),
		g.step("the MALFORMED answer is remembered: its replay gets the same body", T0,
			dg{kind: wire.KindRateRequest, id: m, attempt: 1, flags: flagR, body: mal},
			&wire.RateResponse{Status: wire.StatusMalformed, ServerEpoch: Epoch}),
		g.step("replay of A at t=20 (attempt 1, replay bit): identical body, nothing consumed; A is now kept until 20+60+30000", T0+20,
			dg{kind: wire.KindRateRequest, id: a, attempt: 1, flags: flagR, body: b}, ok(true, rr(4, 0, 0))),
		g.step("t=30070: past the first datagram's window (0+60+30000) but inside the replay's: still the cached answer", T0+30_070,
			dg{kind: wire.KindRateRequest, id: a, attempt: 1, flags: flagR, ts: T0 + 20, body: b}, ok(true, rr(4, 0, 0))),
		g.raw("t=30075: a COMPLETION allow for A stamped 30070: ignored; A is now kept until 30070+60+30000", T0+30_075, lateComp, "none"),
		g.raw("t=60100: the same COMPLETION datagram captured and re-sent: still ignored (nothing consumed)", T0+60_100, lateComp, "none"),
	}
	return serverVector("dedup", "docs/protocol.md §6.4 and §6.5: request ids, replays, reports, completions.", steps,
		BucketState{Tenant: Tenant, Bucket: "d", Tokens: 3})
}

// drops covers §6.0: every datagram that gets no answer.
func (g *gen) drops() Vector {
	b := req(res("x", 5, 1000, 5, 1))
	good := func(id uint64) []byte { return g.seal(dg{kind: wire.KindRateRequest, id: id, ts: T0, body: b}) }
	patch := func(pkt []byte, off int, v byte) []byte { p := append([]byte(nil), pkt...); p[off] = v; return p }
	var trailing []byte
	{
		body := append(append([]byte(nil), b...), 0)
		trailing = g.seal(dg{kind: wire.KindRateRequest, id: 0x900, ts: T0, body: body})
	}
	respBody := enc(ok(true, rr(1, 0, 0)))
	big := make([]byte, 1401)
	copy(big, good(0x910))
	steps := []Step{
		g.drop("shorter than header + tag (67 bytes)", T0, good(0x100)[:67], "truncated"),
		g.drop("over 1400 bytes", T0, big, "too_large"),
		g.drop("bad magic", T0, patch(good(0x200), 0, 'X'), "magic"),
		g.drop("version 2", T0, patch(good(0x300), 2, 2), "version"),
		g.drop("kind 9", T0, patch(good(0x400), 3, 9), "kind"),
		g.drop("unknown key_id 7", T0, patch(good(0x500), 11, 7), "unknown_key"),
		g.drop("sealed with another secret under key_id 42", T0,
			g.seal(dg{key: g.wrong, kind: wire.KindRateRequest, id: 0x600, ts: T0, body: b}), "auth"),
		g.drop("a header byte changed after sealing (the header is authenticated)", T0, patch(good(0x700), 5, 1), "auth"),
		g.drop("timestamp older than now - (ttl_ms + 30 s)", T0,
			g.seal(dg{kind: wire.KindRateRequest, id: 0x800, ts: T0 - 60 - skewMs - 1, body: b}), "stale"),
		g.drop("timestamp more than 30 s ahead", T0,
			g.seal(dg{kind: wire.KindRateRequest, id: 0x810, ts: T0 + skewMs + 1, body: b}), "stale"),
		g.step("timestamp exactly now - (ttl_ms + 30 s): accepted", T0,
			dg{kind: wire.KindRateRequest, id: 0x820, ts: T0 - 60 - skewMs, body: b}, ok(true, rr(4, 0, 0))),
		g.drop("ttl_ms 200 over the credential's max_horizon 100", T0,
			g.seal(dg{key: g.keys[HorizKey], kind: wire.KindRateRequest, id: 0x830, ttl: 200, ts: T0, body: b}), "horizon"),
		g.drop("a trailing byte after the body", T0, trailing, "malformed"),
		g.drop("an empty bucket name", T0,
			g.seal(dg{kind: wire.KindRateRequest, id: 0x840, ts: T0, body: []byte{0, 1, 0, 0, 0, 0, 0, 0, 0, 5, 0, 0, 3, 0xe8, 0, 0, 0, 0, 0, 0, 0, 1}}), "malformed"),
		g.drop("a RATE_RESPONSE sent to a server", T0, g.seal(dg{kind: wire.KindRateResponse, id: 0x850, ts: T0, body: respBody}), "kind"),
	}
	return serverVector("drops", "docs/protocol.md §2-§6.0: datagrams dropped without an answer, in the server's processing order.", steps,
		BucketState{Tenant: Tenant, Bucket: "x", Tokens: 4})
}

// edgeValues covers zero values, clamping and a bucket named twice.
func (g *gen) edgeValues() Vector {
	guard := func(svc string, th uint32) []byte {
		return enc(&wire.RateRequest{Guards: []wire.Guard{{Service: []byte(svc), ThresholdMs: th}}})
	}
	gres := func(success, passed bool, observed uint32) *wire.RateResponse {
		return &wire.RateResponse{Status: wire.StatusOK, Success: success, ServerEpoch: Epoch,
			Guards: []wire.GuardResult{{Passed: passed, ObservedMs: observed}}}
	}
	report := func(svc string, ms uint32) []byte {
		return enc(&wire.LatencyReport{Entries: []wire.ReportEntry{{Service: []byte(svc), DurationMs: ms}}})
	}
	dup := func(cost uint32) []byte {
		return req(res("dup", 1, 3_600_000, 3, cost), res("dup", 1, 3_600_000, 3, cost))
	}
	steps := []Step{
		g.step("cost 0: allowed, nothing consumed", T0, dg{kind: wire.KindRateRequest, id: 0x100, body: req(res("zero", 1, 3_600_000, 1, 0))}, ok(true, rr(1, 0, 0))),
		g.step("request_id 0 is an ordinary id", T0, dg{kind: wire.KindRateRequest, id: 0, body: req(res("zero", 1, 3_600_000, 1, 0))}, ok(true, rr(1, 0, 0))),
		g.step("threshold 0 and no sample: the guard passes, observed 0", T0, dg{kind: wire.KindRateRequest, id: 0x200, body: guard("nodata", 0)}, gres(true, true, 0)),
		g.step("a report with duration 0 is a sample", T0, dg{kind: wire.KindLatencyReport, id: 0x300, body: report("zero", 0)}, nil),
		g.step("threshold 0 with estimate 0: passes (at or under)", T0, dg{kind: wire.KindRateRequest, id: 0x310, body: guard("zero", 0)}, gres(true, true, 0)),
		g.step("a 5 ms report", T0, dg{kind: wire.KindLatencyReport, id: 0x400, body: report("five", 5)}, nil),
		g.step("threshold 0 with estimate 5: fails; a guard-only deny", T0, dg{kind: wire.KindRateRequest, id: 0x410, body: guard("five", 0)}, gres(false, false, 5)),
		g.step("bucket dup named twice, cost 2 each, burst 3: the second sees 1 token: deny, nothing consumed, both report 3 left", T0,
			dg{kind: wire.KindRateRequest, id: 0x500, body: dup(2)}, ok(false, rr(3, 0, 0), rr(3, 1, 3_600_000))),
		g.step("cost 1 each: allowed; both report the bucket after the whole request (1 left)", T0,
			dg{kind: wire.KindRateRequest, id: 0x510, body: dup(1)}, ok(true, rr(1, 0, 0), rr(1, 0, 0))),
		g.step("clamping: cost 4294967295 on a 1-token bucket: deficit 4294967294, retry_after_ms clamped to 4294967295", T0,
			dg{kind: wire.KindRateRequest, id: 0x600, body: req(res("huge", 1, 4_294_967_295, 1, 4_294_967_295))}, ok(false, rr(1, 4_294_967_294, 4_294_967_295))),
		g.step("no guard and no resource: MALFORMED", T0, dg{kind: wire.KindRateRequest, id: 0x700, body: req()},
			&wire.RateResponse{Status: wire.StatusMalformed, ServerEpoch: Epoch}),
	}
	return serverVector("edge-values", "docs/protocol.md §5.1, §6.2, §6.3: zero values, clamping, a bucket named twice in one request.", steps,
		BucketState{Tenant: Tenant, Bucket: "zero", Tokens: 1}, BucketState{Tenant: Tenant, Bucket: "dup", Tokens: 1},
		BucketState{Tenant: Tenant, Bucket: "huge", Tokens: 1})
}
