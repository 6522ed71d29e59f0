package admission

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rl-tproxy/rl-tproxy/pkg/ratelimitly"
	"github.com/rl-tproxy/rl-tproxy/pkg/ratelimitly/wire"
)

// Each kind of deny says what happened: its own body, its Retry-After
// rule, and no RateLimit field unless a zone ran out.
func TestDenyAnswerPerKind(t *testing.T) {
	a := NewDenyAnswer(AnswerSpec{RateLimitHeaders: true, JSON: true, GuardRetryAfter: 7 * time.Second,
		Zones: []AnswerZone{{Name: "per_client", Quota: 5, Window: time.Second}}})
	valid := func(guards []wire.GuardResult, res []wire.ResourceResult) *Decision {
		d := &Decision{Verdict: VerdictDeny, Outcome: OutcomeDeny, Action: ActionDeny, Cause: ratelimitly.CauseDenyGuard}
		d.Result = validResp(wire.StatusOK, false, guards, res)
		for _, rr := range res {
			d.Zones = append(d.Zones, ZoneState{Remaining: rr.Remaining, RetryAfterMs: rr.RetryAfterMs, Known: true})
		}
		return d
	}
	for _, c := range []struct {
		name      string
		d         *Decision
		kind      DenyKind
		retry     string
		rateLimit string
		body      string
	}{
		// The case: quota left, yet a guard shed the request.
		{"guard", valid(badGuard, []wire.ResourceResult{{Remaining: 5}}), DenyGuard, "7", "", GuardMessage},
		{"guard-only-location", valid(badGuard, nil), DenyGuard, "7", "", GuardMessage},
		{"zone", valid(okGuard, []wire.ResourceResult{{TokensDeficit: 1, RetryAfterMs: 1500}}), DenyRateLimit, "2", `"per_client";r=0;t=2`, "rate limit exceeded"},
		{"zone-and-guard", valid(badGuard, []wire.ResourceResult{{TokensDeficit: 1, RetryAfterMs: 1500}}), DenyRateLimit, "7", `"per_client";r=0;t=2`, "rate limit exceeded"},
		{"zone-longer-than-guard", valid(badGuard, []wire.ResourceResult{{TokensDeficit: 1, RetryAfterMs: 12000}}), DenyRateLimit, "12", `"per_client";r=0;t=12`, "rate limit exceeded"},
		{"fail-close", &Decision{Outcome: OutcomeFailClose, Action: ActionDeny, Cause: ratelimitly.CauseTimeout, Zones: []ZoneState{{}}}, DenyFailClose, "1", "", FailCloseMessage},
	} {
		t.Run(c.name, func(t *testing.T) {
			if k := c.d.DenyKind(); k != c.kind {
				t.Fatalf("kind %d, want %d", k, c.kind)
			}
			hs, _, body := a.RenderDecision(nil, nil, c.d)
			m := hdrMap(hs)
			if m["Retry-After"] != c.retry || m["RateLimit"] != c.rateLimit || m["RateLimit-Policy"] != `"per_client";q=5;w=1` {
				t.Errorf("headers %v, want Retry-After %s and RateLimit %q", m, c.retry, c.rateLimit)
			}
			if !strings.Contains(string(body), c.body) || !strings.HasPrefix(string(body), `{"status":429,"error":`) {
				t.Errorf("body %q, want %q", body, c.body)
			}
			if got := strconv.Itoa(int(a.RetryAfter(c.d))); got != c.retry {
				t.Errorf("RetryAfter %s, want %s", got, c.retry)
			}
		})
	}
}

// guardPolicy is testPolicy with deny.guard_probe set: probes per period.
func guardPolicy(t *testing.T, probes uint32, period time.Duration, mode Mode) (*Policy, *Service) {
	p, svc := testPolicy(t, FailClose, mode)
	svc.Locations[0].GuardProbe = newGuardProbe(probeRate{Rate: probes, PeriodMs: uint32(period / time.Millisecond)})
	return p, svc
}

// While only latency guards deny, deny.guard_probe admits that many
// requests per period as probes (reported, verdict still deny); a zone
// deny is never probed, nor is a shadow location's would-deny changed.
func TestGuardProbe(t *testing.T) {
	now := time.Unix(1000, 0)
	clock := func() time.Time { return now }
	t.Run("guard-deny", func(t *testing.T) {
		p, svc := guardPolicy(t, 2, time.Second, ModeEnforce)
		e := &Engine{Checker: &scriptChecker{res: validResp(wire.StatusOK, false, badGuard, okRes)}, Now: clock}
		var d Decision
		var got []Outcome
		for i := 0; i < 4; i++ {
			e.Decide(context.Background(), p, svc, testRequest(hdrs{"x-key": "a"}), &d)
			got = append(got, d.Outcome)
			if d.Verdict != VerdictDeny || d.Cause != ratelimitly.CauseDenyGuard {
				t.Fatalf("request %d: verdict %v cause %v", i, d.Verdict, d.Cause)
			}
			if admitted := d.Action == ActionAdmit; admitted != (d.Outcome == OutcomeGuardProbe) || ShouldReport(true, d.Outcome, admitted, false) != admitted {
				t.Fatalf("request %d: outcome %v action %v", i, d.Outcome, d.Action)
			}
		}
		now = now.Add(500 * time.Millisecond) // one token back
		for i := 0; i < 2; i++ {
			e.Decide(context.Background(), p, svc, testRequest(hdrs{"x-key": "a"}), &d)
			got = append(got, d.Outcome)
		}
		want := []Outcome{OutcomeGuardProbe, OutcomeGuardProbe, OutcomeDeny, OutcomeDeny, OutcomeGuardProbe, OutcomeDeny}
		for i := range want {
			if got[i] != want[i] {
				t.Fatalf("outcomes %v, want %v", got, want)
			}
		}
	})
	t.Run("zone-deny", func(t *testing.T) {
		p, svc := guardPolicy(t, 100, time.Second, ModeEnforce)
		e := &Engine{Checker: &scriptChecker{res: validResp(wire.StatusOK, false, badGuard, shortRes)}, Now: clock}
		var d Decision
		e.Decide(context.Background(), p, svc, testRequest(hdrs{"x-key": "a"}), &d)
		if d.Outcome != OutcomeDeny || d.Action != ActionDeny {
			t.Fatalf("a short zone was probed: %v %v", d.Outcome, d.Action)
		}
	})
	t.Run("shadow", func(t *testing.T) {
		p, svc := guardPolicy(t, 100, time.Second, ModeShadow)
		e := &Engine{Checker: &scriptChecker{res: validResp(wire.StatusOK, false, badGuard, okRes)}, Now: clock}
		var d Decision
		e.Decide(context.Background(), p, svc, testRequest(hdrs{"x-key": "a"}), &d)
		if d.Outcome != OutcomeShadowDeny || d.Action != ActionAdmit {
			t.Fatalf("shadow guard deny: %v %v", d.Outcome, d.Action)
		}
	})
	// Abuse: a flood of guard-denied requests at one instant gets the
	// bucket's capacity of probes, no more; a clock that steps back
	// refills nothing.
	t.Run("flood", func(t *testing.T) {
		g := newGuardProbe(probeRate{Rate: 3, PeriodMs: 1000})
		at := time.Unix(2000, 0)
		n := 0
		for i := 0; i < 10000; i++ {
			if g.Take(at) {
				n++
			}
		}
		if g.Take(at.Add(-time.Hour)) {
			n++
		}
		if n != 3 {
			t.Fatalf("%d probes from a flood, want 3", n)
		}
	})
}

func TestGuardDenySettingsLoad(t *testing.T) {
	const head = `ratelimitly: {embedded: true}
trackers:
  tr: {service: "t"}
services:
  - name: web
    listen: 127.0.0.1:8080
    upstream: 127.0.0.1:8081
    guard: [{tracker: tr, threshold: 100ms}]
`
	for _, c := range []struct {
		deny    string
		retry   time.Duration
		probe   string // "" = none
		wantErr string
	}{
		{"", DefaultGuardRetryAfter, "", ""},
		{"deny: {guard_retry_after: 30s, guard_probe: 2/s}", 30 * time.Second, "2/1s", ""},
		{"deny: {guard_probe: 10/m}", DefaultGuardRetryAfter, "10/1m0s", ""},
		{"deny: {guard_retry_after: 1500ms}", 0, "", "deny.guard_retry_after: 1.5s is not whole seconds"},
		{"deny: {guard_retry_after: 0s}", 0, "", "deny.guard_retry_after"},
		{"deny: {guard_retry_after: 2h}", 0, "", "deny.guard_retry_after"},
		{"deny: {guard_probe: 0/s}", 0, "", "deny.guard_probe"},
		{"deny: {guard_probe: often}", 0, "", "deny.guard_probe"},
	} {
		t.Run(c.deny, func(t *testing.T) {
			p, err := Parse("p.yaml", []byte(head+"    "+c.deny+"\n"))
			if c.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), c.wantErr) {
					t.Fatalf("err %v, want %q", err, c.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			loc := p.Services[0].Locations[0]
			probe := ""
			if g := loc.GuardProbe; g != nil {
				probe = strconv.Itoa(int(g.Rate)) + "/" + g.Period.String()
			}
			if loc.Deny.GuardRetryAfter != c.retry || probe != c.probe {
				t.Fatalf("guard_retry_after %v probe %q, want %v %q", loc.Deny.GuardRetryAfter, probe, c.retry, c.probe)
			}
		})
	}
}
