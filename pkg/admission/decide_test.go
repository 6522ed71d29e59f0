package admission

import (
	"context"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/rl-tproxy/rl-tproxy/pkg/ratelimitly"
	"github.com/rl-tproxy/rl-tproxy/pkg/ratelimitly/wire"
)

// scriptChecker answers every check with a fixed result and records what
// it was asked.
type scriptChecker struct {
	res     CheckResult
	mutate  func(req *wire.RateRequest, out *CheckResult)
	calls   int
	last    wire.RateRequest
	reports int
}

func (c *scriptChecker) Check(ctx context.Context, req *wire.RateRequest, out *CheckResult) {
	c.calls++
	c.last = *req
	out.Valid, out.Fail = c.res.Valid, c.res.Fail
	out.Resp.Status, out.Resp.Success = c.res.Resp.Status, c.res.Resp.Success
	out.Resp.Guards = append(out.Resp.Guards[:0], c.res.Resp.Guards...)
	out.Resp.Resources = append(out.Resp.Resources[:0], c.res.Resp.Resources...)
	if c.mutate != nil {
		c.mutate(req, out)
	}
}

func (c *scriptChecker) Report([]byte, time.Duration) { c.reports++ }

type hdrs map[string]string

// byteHdrs is a HeaderGetter that does not allocate.
type byteHdrs map[string][]byte

func (h byteHdrs) HeaderValue(name string) ([]byte, bool) {
	v, ok := h[name]
	return v, ok
}

func (h hdrs) getter() byteHdrs {
	b := byteHdrs{}
	for k, v := range h {
		b[strings.ToLower(k)] = []byte(v)
	}
	return b
}

func mustTmpl(t testing.TB, s string) *Template {
	t.Helper()
	tm, err := CompileTemplate(s)
	if err != nil {
		t.Fatal(err)
	}
	return tm
}

// testPolicy has one service with one protected location: a zone keyed by
// the x-key header (burst 2), a guard on tracker "api" and a label.
func testPolicy(t testing.TB, fail FailPolicy, mode Mode) (*Policy, *Service) {
	z := &Zone{Name: "per_key", Bucket: mustTmpl(t, "{header.x-key}"), Rate: 1, PeriodMs: 1000, Burst: 2, Cost: 1}
	tr := &Tracker{Name: "api", Service: mustTmpl(t, "svc:{host}")}
	svc := &Service{Name: "web", Deny: Deny{Status: 429}}
	loc := &Location{Service: svc, Name: "api", Limits: []*Zone{z}, Guards: []Guard{{Tracker: tr, Threshold: 250 * time.Millisecond, ThresholdMs: 250}},
		Label: mustTmpl(t, "{header.x-label}"), Report: tr, Mode: mode}
	svc.Locations = []*Location{loc}
	p := &Policy{RateLimitly: RateLimitly{Fail: fail}, Zones: []*Zone{z}, Trackers: []*Tracker{tr}, Services: []*Service{svc}}
	return p, svc
}

func testRequest(h hdrs) *Request {
	return &Request{Remote: netip.MustParseAddrPort("10.0.0.1:5555"), Local: netip.MustParseAddrPort("127.0.0.1:8080"),
		Method: []byte("GET"), Host: []byte("example.com"), Path: []byte("/x"), Headers: h.getter()}
}

func validResp(status uint8, success bool, guards []wire.GuardResult, res []wire.ResourceResult) CheckResult {
	return CheckResult{Valid: true, Resp: wire.RateResponse{Status: status, Success: success, Guards: guards, Resources: res}}
}

var (
	okGuard  = []wire.GuardResult{{Passed: true, ObservedMs: 10}}
	badGuard = []wire.GuardResult{{Passed: false, ObservedMs: 900}}
	okRes    = []wire.ResourceResult{{Remaining: 5}}
	shortRes = []wire.ResourceResult{{Remaining: 0, TokensDeficit: 1, RetryAfterMs: 1500}}
)

// TestFailureTable is the failure table of the contract (seed 000), every
// row under open, close and local. Under local the fallback bucket (burst
// 2) decides: the first two requests are admitted, the third is denied.
func TestFailureTable(t *testing.T) {
	type want struct {
		verdict Verdict
		cause   ratelimitly.Cause
		outcome [3]Outcome // open, close, local (first request)
		action  [3]Action
	}
	admitted := [3]Action{ActionAdmit, ActionDeny, ActionAdmit}
	failOut := [3]Outcome{OutcomeFailOpen, OutcomeFailClose, OutcomeFailLocal}
	rows := []struct {
		name   string
		res    CheckResult
		mutate func(*wire.RateRequest, *CheckResult)
		h      hdrs
		want   want
	}{
		{"valid allow", validResp(wire.StatusOK, true, okGuard, okRes), nil, nil,
			want{VerdictAllow, ratelimitly.CauseAllow, [3]Outcome{OutcomeAllow, OutcomeAllow, OutcomeAllow}, [3]Action{ActionAdmit, ActionAdmit, ActionAdmit}}},
		{"resource deny", validResp(wire.StatusOK, false, okGuard, shortRes), nil, nil,
			want{VerdictDeny, ratelimitly.CauseDenyResource, [3]Outcome{OutcomeDeny, OutcomeDeny, OutcomeDeny}, [3]Action{ActionDeny, ActionDeny, ActionDeny}}},
		{"guard deny", validResp(wire.StatusOK, false, badGuard, okRes), nil, nil,
			want{VerdictDeny, ratelimitly.CauseDenyGuard, [3]Outcome{OutcomeDeny, OutcomeDeny, OutcomeDeny}, [3]Action{ActionDeny, ActionDeny, ActionDeny}}},
		{"guard failed though success", validResp(wire.StatusOK, true, badGuard, okRes), nil, nil,
			want{VerdictDeny, ratelimitly.CauseDenyGuard, [3]Outcome{OutcomeDeny, OutcomeDeny, OutcomeDeny}, [3]Action{ActionDeny, ActionDeny, ActionDeny}}},
		{"deficit though success", validResp(wire.StatusOK, true, okGuard, shortRes), nil, nil,
			want{VerdictDeny, ratelimitly.CauseDenyResource, [3]Outcome{OutcomeDeny, OutcomeDeny, OutcomeDeny}, [3]Action{ActionDeny, ActionDeny, ActionDeny}}},
		{"RateLimitly deny (success false)", validResp(wire.StatusOK, false, okGuard, okRes), nil, nil,
			want{VerdictDeny, ratelimitly.CauseDenyRefused, [3]Outcome{OutcomeDeny, OutcomeDeny, OutcomeDeny}, [3]Action{ActionDeny, ActionDeny, ActionDeny}}},
		{"RateLimitly status over quota (not a valid answer)", validResp(wire.StatusOverQuota, true, okGuard, okRes), nil, nil,
			want{VerdictNone, ratelimitly.CauseProtocol, failOut, admitted}},
		{"RateLimitly status unavailable (not a valid answer)", validResp(wire.StatusUnavailable, false, okGuard, okRes), nil, nil,
			want{VerdictNone, ratelimitly.CauseProtocol, failOut, admitted}},
		{"no usable discovery target", CheckResult{Fail: ratelimitly.CauseNoEndpoints}, nil, nil, want{VerdictNone, ratelimitly.CauseNoEndpoints, failOut, admitted}},
		{"UDP send failure", CheckResult{Fail: ratelimitly.CauseSendFailure}, nil, nil, want{VerdictNone, ratelimitly.CauseSendFailure, failOut, admitted}},
		{"response timeout", CheckResult{Fail: ratelimitly.CauseTimeout}, nil, nil, want{VerdictNone, ratelimitly.CauseTimeout, failOut, admitted}},
		{"authentication/protocol failure", CheckResult{Fail: ratelimitly.CauseProtocol}, nil, nil, want{VerdictNone, ratelimitly.CauseProtocol, failOut, admitted}},
		{"cardinality mismatch (client)", CheckResult{Fail: ratelimitly.CauseCardinality}, nil, nil, want{VerdictNone, ratelimitly.CauseCardinality, failOut, admitted}},
		{"cardinality mismatch (extra resource)", validResp(wire.StatusOK, true, okGuard, append(okRes, okRes...)), nil, nil,
			want{VerdictNone, ratelimitly.CauseCardinality, failOut, admitted}},
		{"cardinality mismatch (missing guard)", validResp(wire.StatusOK, true, nil, okRes), nil, nil,
			want{VerdictNone, ratelimitly.CauseCardinality, failOut, admitted}},
		{"invalid dynamic value (empty bucket)", validResp(wire.StatusOK, true, okGuard, okRes), nil, hdrs{"x-key": ""},
			want{VerdictNone, ratelimitly.CauseInvalidValue, failOut, admitted}},
		{"invalid dynamic value (bucket over 1024)", validResp(wire.StatusOK, true, okGuard, okRes), nil, hdrs{"x-key": strings.Repeat("b", 1030)},
			want{VerdictNone, ratelimitly.CauseInvalidValue, failOut, admitted}},
		{"invalid dynamic value (label over 256)", validResp(wire.StatusOK, true, okGuard, okRes), nil, hdrs{"x-key": "a", "x-label": strings.Repeat("l", 257)},
			want{VerdictNone, ratelimitly.CauseInvalidValue, failOut, admitted}},
		{"request-construction failure", CheckResult{Fail: ratelimitly.CauseConstruction}, nil, nil, want{VerdictNone, ratelimitly.CauseConstruction, failOut, admitted}},
		{"internal failure", CheckResult{Fail: ratelimitly.CauseInternal}, nil, nil,
			want{VerdictNone, ratelimitly.CauseInternal, [3]Outcome{OutcomeInternalError, OutcomeInternalError, OutcomeInternalError}, [3]Action{ActionInternal, ActionInternal, ActionInternal}}},
	}
	for _, row := range rows {
		for fi, fail := range []FailPolicy{FailOpen, FailClose, FailLocal} {
			for _, split := range []bool{false, true} {
				name := row.name + "/" + fail.String()
				if split {
					name += "/begin-end"
				}
				t.Run(name, func(t *testing.T) {
					p, svc := testPolicy(t, fail, ModeEnforce)
					ch := &scriptChecker{res: row.res, mutate: row.mutate}
					e := &Engine{Checker: ch, Local: NewLocalLimiter(nil, 0)}
					h := row.h
					if h == nil {
						h = hdrs{"x-key": "alice", "x-label": "lbl"}
					}
					var d Decision
					decide := func(d *Decision) {
						if !split {
							e.Decide(context.Background(), p, svc, testRequest(h), d)
							return
						}
						// What an event loop does: Begin, the check, End.
						if !e.Begin(p, svc, testRequest(h), d) {
							ch.Check(context.Background(), &d.Req, &d.Result)
							e.End(p, d, false)
						}
					}
					decide(&d)
					if d.Verdict != row.want.verdict || d.Cause != row.want.cause || d.Outcome != row.want.outcome[fi] || d.Action != row.want.action[fi] {
						t.Fatalf("got verdict %v cause %v outcome %v action %v; want %v %v %v %v",
							d.Verdict, d.Cause, d.Outcome, d.Action, row.want.verdict, row.want.cause, row.want.outcome[fi], row.want.action[fi])
					}
					if row.want.cause == ratelimitly.CauseInvalidValue && ch.calls != 0 {
						t.Fatal("an invalid rendered value was sent to RateLimitly")
					}
					if fail == FailLocal && row.want.outcome[fi] == OutcomeFailLocal && row.want.cause != ratelimitly.CauseInvalidValue {
						// The local bucket (burst 2) admits one more, then denies.
						decide(&d)
						if d.Action != ActionAdmit {
							t.Fatalf("second local request: %v", d.Action)
						}
						decide(&d)
						if d.Outcome != OutcomeFailLocal || d.Action != ActionDeny || len(d.Zones) != 1 || d.Zones[0].RetryAfterMs == 0 {
							t.Fatalf("third local request: outcome %v action %v zones %+v", d.Outcome, d.Action, d.Zones)
						}
					}
				})
			}
		}
	}
}

func TestDecideBuildsOneCombinedCheck(t *testing.T) {
	p, svc := testPolicy(t, FailOpen, ModeEnforce)
	ch := &scriptChecker{res: validResp(wire.StatusOK, true, okGuard, okRes)}
	e := &Engine{Checker: ch}
	var d Decision
	e.Decide(context.Background(), p, svc, testRequest(hdrs{"x-key": "alice", "x-label": "L"}), &d)
	if ch.calls != 1 {
		t.Fatalf("%d checks", ch.calls)
	}
	r := ch.last
	if string(r.Label) != "L" || len(r.Guards) != 1 || string(r.Guards[0].Service) != "svc:example.com" || r.Guards[0].ThresholdMs != 250 ||
		len(r.Resources) != 1 || string(r.Resources[0].Bucket) != "alice" || r.Resources[0].Rate != 1 || r.Resources[0].PeriodMs != 1000 ||
		r.Resources[0].Burst != 2 || r.Resources[0].Cost != 1 {
		t.Fatalf("request %+v", r)
	}
	// An empty label is omitted.
	e.Decide(context.Background(), p, svc, testRequest(hdrs{"x-key": "alice"}), &d)
	if ch.last.Label != nil {
		t.Fatalf("empty label sent: %q", ch.last.Label)
	}
}

// Decision.Admission covers the check: with the real clock it is at least
// what the checker itself saw pass (both monotonic), with an injected one
// exactly the clock's advance.
func TestAdmissionDurationCoversCheck(t *testing.T) {
	p, svc := testPolicy(t, FailOpen, ModeEnforce)
	var inCheck time.Duration
	ch := &scriptChecker{res: validResp(wire.StatusOK, true, okGuard, okRes), mutate: func(*wire.RateRequest, *CheckResult) {
		t0 := time.Now()
		for time.Since(t0) < time.Millisecond { // the check takes a while; no sleep: a busy wait
		}
		inCheck = time.Since(t0)
	}}
	var d Decision
	(&Engine{Checker: ch}).Decide(context.Background(), p, svc, testRequest(hdrs{"x-key": "alice"}), &d)
	if d.Admission < inCheck {
		t.Fatalf("admission %v, the check alone took %v", d.Admission, inCheck)
	}
	now := time.Unix(1000, 0)
	ch.mutate = func(*wire.RateRequest, *CheckResult) { now = now.Add(7 * time.Millisecond) }
	(&Engine{Checker: ch, Now: func() time.Time { return now }}).Decide(context.Background(), p, svc, testRequest(hdrs{"x-key": "alice"}), &d)
	if d.Admission != 7*time.Millisecond {
		t.Fatalf("admission %v with the clock advanced 7ms in the check", d.Admission)
	}
}

func TestUnprotectedAndUnmatchedSendNothing(t *testing.T) {
	p, svc := testPolicy(t, FailClose, ModeEnforce)
	svc.Locations[0].Match = Match{Path: "/only"}
	open := &Location{Service: svc, Name: "open", Report: svc.Locations[0].Report}
	svc.Locations = append(svc.Locations, open)
	ch := &scriptChecker{res: validResp(wire.StatusOK, true, okGuard, okRes)}
	e := &Engine{Checker: ch}
	var d Decision
	e.Decide(context.Background(), p, svc, testRequest(hdrs{"x-key": "a"}), &d)
	if d.Outcome != OutcomeBypass || d.Cause != ratelimitly.CauseUnprotected || d.Location != open || d.Action != ActionAdmit {
		t.Fatalf("unprotected: %v %v", d.Outcome, d.Cause)
	}
	svc.Locations = svc.Locations[:1]
	e.Decide(context.Background(), p, svc, testRequest(hdrs{"x-key": "a"}), &d)
	if d.Outcome != OutcomeBypass || d.Cause != ratelimitly.CauseUnmatched || d.Location != nil {
		t.Fatalf("unmatched: %v %v", d.Outcome, d.Cause)
	}
	e.Decide(context.Background(), p, nil, testRequest(nil), &d)
	if d.Outcome != OutcomeBypass || d.Cause != ratelimitly.CauseUnmatched {
		t.Fatalf("no service: %v %v", d.Outcome, d.Cause)
	}
	if ch.calls != 0 {
		t.Fatalf("%d checks sent for unprotected/unmatched requests", ch.calls)
	}
}

func TestShadowMode(t *testing.T) {
	for _, c := range []struct {
		fail FailPolicy
		res  CheckResult
		out  Outcome
	}{
		{FailOpen, validResp(wire.StatusOK, false, okGuard, shortRes), OutcomeShadowDeny},
		{FailClose, CheckResult{Fail: ratelimitly.CauseTimeout}, OutcomeShadowDeny},
		{FailOpen, CheckResult{Fail: ratelimitly.CauseTimeout}, OutcomeFailOpen},
		{FailOpen, validResp(wire.StatusOK, true, okGuard, okRes), OutcomeAllow},
	} {
		p, svc := testPolicy(t, c.fail, ModeShadow)
		e := &Engine{Checker: &scriptChecker{res: c.res}}
		var d Decision
		e.Decide(context.Background(), p, svc, testRequest(hdrs{"x-key": "a"}), &d)
		if d.Outcome != c.out || d.Action != ActionAdmit {
			t.Errorf("%v %+v: outcome %v action %v, want %v admit", c.fail, c.res.Fail, d.Outcome, d.Action, c.out)
		}
	}
}

func TestClientAbortDuringCheck(t *testing.T) {
	p, svc := testPolicy(t, FailClose, ModeEnforce)
	ctx, cancel := context.WithCancel(context.Background())
	ch := &scriptChecker{res: CheckResult{Fail: ratelimitly.CauseTimeout}, mutate: func(*wire.RateRequest, *CheckResult) { cancel() }}
	var d Decision
	(&Engine{Checker: ch}).Decide(ctx, p, svc, testRequest(hdrs{"x-key": "a"}), &d)
	if d.Outcome != OutcomeClientAbort || d.Cause != ratelimitly.CauseCancelled || d.Action != ActionDrop || d.Verdict != VerdictNone {
		t.Fatalf("abort: %v %v %v %v", d.Verdict, d.Outcome, d.Cause, d.Action)
	}
	// The same through Begin and End: a cancelled check ends the same way,
	// and a valid answer that arrived before the cancel still decides.
	e := &Engine{}
	if e.Begin(p, svc, testRequest(hdrs{"x-key": "a"}), &d) {
		t.Fatal("Begin decided a protected request")
	}
	d.Result = CheckResult{Fail: ratelimitly.CauseTimeout}
	e.End(p, &d, true)
	if d.Outcome != OutcomeClientAbort || d.Cause != ratelimitly.CauseCancelled || d.Action != ActionDrop {
		t.Fatalf("abort via End: %v %v %v", d.Outcome, d.Cause, d.Action)
	}
	e.Begin(p, svc, testRequest(hdrs{"x-key": "a"}), &d)
	d.Result = validResp(wire.StatusOK, true, okGuard, okRes)
	e.End(p, &d, true)
	if d.Cause != ratelimitly.CauseAllow || d.Action != ActionAdmit {
		t.Fatalf("decided before the cancel: %v %v", d.Cause, d.Action)
	}
}

// TestReportRules: at most one report, only after completed work the
// contract allows.
func TestReportRules(t *testing.T) {
	for _, c := range []struct {
		o                  Outcome
		admitted, aborted  bool
		hasReport, reports bool
	}{
		{OutcomeAllow, true, false, true, true},
		{OutcomeFailOpen, true, false, true, true},
		{OutcomeBypass, true, false, true, true},
		{OutcomeShadowDeny, true, false, true, true},
		{OutcomeFailLocal, true, false, true, true},
		{OutcomeFailLocal, false, false, true, false},
		{OutcomeAllow, true, false, false, false},
		{OutcomeAllow, true, true, true, false},
		{OutcomeDeny, false, false, true, false},
		{OutcomeFailClose, false, false, true, false},
		{OutcomeInternalError, false, false, true, false},
		{OutcomeClientAbort, false, true, true, false},
	} {
		if got := ShouldReport(c.hasReport, c.o, c.admitted, c.aborted); got != c.reports {
			t.Errorf("%v admitted=%v aborted=%v report=%v: %v, want %v", c.o, c.admitted, c.aborted, c.hasReport, got, c.reports)
		}
	}
}

func TestReportDurationClamp(t *testing.T) {
	for _, c := range []struct {
		d    time.Duration
		want uint32
	}{
		{-time.Second, 1}, {0, 1}, {999 * time.Microsecond, 1}, {time.Millisecond, 1}, {1500 * time.Microsecond, 1},
		{250 * time.Millisecond, 250}, {4294967295 * time.Millisecond, 4294967295}, {4294967296 * time.Millisecond, 4294967295},
		{1 << 62, 4294967295},
	} {
		if got := ReportMs(c.d); got != c.want {
			t.Errorf("%v: %d, want %d", c.d, got, c.want)
		}
	}
}

func TestOutcomeAndCauseNames(t *testing.T) {
	seen := map[string]bool{}
	for i := Outcome(0); i < numOutcomes; i++ {
		if seen[i.String()] {
			t.Fatalf("duplicate outcome %s", i)
		}
		seen[i.String()] = true
	}
	for i := ratelimitly.Cause(0); i < ratelimitly.NumCauses; i++ {
		if seen["c:"+i.String()] || i.String() == "unknown" {
			t.Fatalf("bad cause %d %s", i, i)
		}
		seen["c:"+i.String()] = true
	}
	if VerdictNone.String() != "-" || VerdictAllow.String() != "allow" || VerdictDeny.String() != "deny" {
		t.Fatal("verdict names")
	}
}

func BenchmarkDecide(b *testing.B) {
	p, svc := testPolicy(b, FailOpen, ModeEnforce)
	e := &Engine{Checker: &scriptChecker{res: validResp(wire.StatusOK, true, okGuard, okRes)}}
	r := testRequest(hdrs{"x-key": "alice", "x-label": "L"})
	var d Decision
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		e.Decide(ctx, p, svc, r, &d)
	}
}
