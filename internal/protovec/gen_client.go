package protovec

import (
	"encoding/hex"

	"github.com/rl-tproxy/rl-tproxy/pkg/ratelimitly/wire"
)

// ClientRequestID is the request id of the client vectors. Its low 6 bits
// are zero because the reference client keeps them zero (it carries the
// endpoint index there); any id is valid on the wire.
const ClientRequestID = 0x0123456789abcdc0

// ClientRequest is the request of the client vectors: the example request
// of docs/protocol.md §13.
func ClientRequest() *wire.RateRequest {
	return &wire.RateRequest{
		Label:     []byte("api"),
		Guards:    []wire.Guard{{Service: []byte("checkout"), ThresholdMs: 250}},
		Resources: []wire.Resource{{Bucket: []byte("client:192.0.2.10"), Rate: 100, PeriodMs: 1000, Burst: 50, Cost: 1}},
	}
}

// clientAnswers: how a client treats every kind of answer to its request
// (one endpoint, standard policy, unit 20 ms: ttl_ms 60).
func (g *gen) clientAnswers() Vector {
	const id, at = ClientRequestID, T0 + 3
	pass := []wire.GuardResult{{Passed: true, ObservedMs: 120}}
	fail := []wire.GuardResult{{Passed: false, ObservedMs: 900}}
	full := []wire.ResourceResult{{Remaining: 49}}
	short := []wire.ResourceResult{{TokensDeficit: 1, RetryAfterMs: 10}}
	resp := func(status uint8, success bool, gs []wire.GuardResult, rs []wire.ResourceResult) []byte {
		return enc(&wire.RateResponse{Status: status, Success: success, ServerEpoch: Epoch, Guards: gs, Resources: rs})
	}
	okAns := dg{kind: wire.KindRateResponse, flags: flagS, id: id, ts: at}
	with := func(d dg, body []byte) string { d.body = body; return hex.EncodeToString(g.seal(d)) }
	allow := resp(wire.StatusOK, true, pass, full)
	cases := []ClientCase{
		{Name: "allow", AnswerHex: with(okAns, allow), Expect: "valid", Cause: "allow"},
		{Name: "deny: resource short", AnswerHex: with(okAns, resp(wire.StatusOK, false, pass, short)), Expect: "valid", Cause: "deny_resource"},
		{Name: "deny: guard failed", AnswerHex: with(okAns, resp(wire.StatusOK, false, fail, full)), Expect: "valid", Cause: "deny_guard"},
		{Name: "deny: success 0 with nothing short", AnswerHex: with(okAns, resp(wire.StatusOK, false, pass, full)), Expect: "valid", Cause: "deny_refused"},
		{Name: "success 1 but a deficit: deny", Comment: "allow needs success, every guard passed and every deficit 0",
			AnswerHex: with(okAns, resp(wire.StatusOK, true, pass, short)), Expect: "valid", Cause: "deny_resource"},
		{Name: "success 1 but a failed guard: deny", AnswerHex: with(okAns, resp(wire.StatusOK, true, fail, full)), Expect: "valid", Cause: "deny_guard"},
		{Name: "steering_feedback 0: still a valid answer (the client moves its source port)",
			AnswerHex: with(dg{kind: wire.KindRateResponse, id: id, ts: at}, allow), Expect: "valid", Cause: "allow"},
		{Name: "status UNAVAILABLE", Comment: "not a decision: the server is still missing a valid answer",
			AnswerHex: with(okAns, resp(wire.StatusUnavailable, false, nil, nil)), Expect: "not_valid", Cause: "protocol"},
		{Name: "status UNAVAILABLE, the replay answered with attempt 1",
			Comment:         "the replay is answered by a datagram echoing attempt 1 and the replay bit; not valid either: the check fails at once",
			AnswerHex:       with(okAns, resp(wire.StatusUnavailable, false, nil, nil)),
			ReplayAnswerHex: with(dg{kind: wire.KindRateResponse, flags: flagS | flagR, attempt: 1, id: id, ts: at + 20}, resp(wire.StatusUnavailable, false, nil, nil)),
			Expect:          "not_valid", Cause: "protocol"},
		{Name: "status OVER_QUOTA", AnswerHex: with(okAns, resp(wire.StatusOverQuota, false, nil, nil)), Expect: "not_valid", Cause: "protocol"},
		{Name: "status MALFORMED", AnswerHex: with(okAns, resp(wire.StatusMalformed, false, nil, nil)), Expect: "not_valid", Cause: "protocol"},
		{Name: "one guard result too many", AnswerHex: with(okAns, resp(wire.StatusOK, true, append(pass, pass...), full)), Expect: "not_valid", Cause: "cardinality"},
		{Name: "resource result missing", AnswerHex: with(okAns, resp(wire.StatusOK, true, pass, nil)), Expect: "not_valid", Cause: "cardinality"},
		{Name: "body with a trailing byte", AnswerHex: with(okAns, append(append([]byte(nil), allow...), 0)),
			Expect: "not_valid", Cause: "protocol", DropReason: "body"},
		{Name: "sealed with another secret", AnswerHex: hex.EncodeToString(g.seal(dg{key: g.wrong, kind: wire.KindRateResponse, flags: flagS, id: id, ts: at, body: allow})),
			Expect: "drop", DropReason: "auth", Cause: "protocol",
			Comment: "from the endpoint's address: the server holds another key, so the check that gets nothing else fails with protocol, not timeout"},
		{Name: "stale timestamp", AnswerHex: with(dg{kind: wire.KindRateResponse, flags: flagS, id: id, ts: T0 - 60 - skewMs - 1}, allow), Expect: "drop", DropReason: "stale", Cause: "timeout"},
		{Name: "ttl_ms not echoed", AnswerHex: with(dg{kind: wire.KindRateResponse, flags: flagS, id: id, ts: at, ttl: 61}, allow), Expect: "drop", DropReason: "echo", Cause: "protocol"},
		{Name: "attempt above the highest sent", AnswerHex: with(dg{kind: wire.KindRateResponse, flags: flagS | flagR, attempt: 1, id: id, ts: at}, allow), Expect: "drop", DropReason: "echo", Cause: "protocol"},
		{Name: "replay bit on attempt 0", AnswerHex: with(dg{kind: wire.KindRateResponse, flags: flagS | flagR, id: id, ts: at}, allow), Expect: "drop", DropReason: "echo", Cause: "protocol"},
		{Name: "another request id", AnswerHex: with(dg{kind: wire.KindRateResponse, flags: flagS, id: id + 64, ts: at}, allow), Expect: "drop", DropReason: "unknown_id", Cause: "timeout"},
		{Name: "a RATE_REQUEST sent to the client", AnswerHex: with(dg{kind: wire.KindRateRequest, id: id, ts: at}, enc(ClientRequest())), Expect: "drop", DropReason: "kind", Cause: "timeout"},
	}
	return Vector{Name: "client-answers", Role: "client", Credentials: creds()[:1],
		Description: "docs/protocol.md §7: the client sends request_body_hex (kind 1, attempt 0, flags 0, ttl_ms 60, request_id) to its one endpoint and receives answer_hex from that endpoint's address and port.",
		Policy:      &Policy{Name: "standard", UnitMs: 20}, NowMs: T0, RequestID: idHex(id),
		RequestBodyHex: hex.EncodeToString(enc(ClientRequest())), Cases: cases}
}
