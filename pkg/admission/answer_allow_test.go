package admission

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/rl-tproxy/rl-tproxy/pkg/httpparse"
	"github.com/rl-tproxy/rl-tproxy/pkg/ratelimitly"
	"github.com/rl-tproxy/rl-tproxy/pkg/ratelimitly/wire"
)

// rlFieldsPolicy has a tiered zone before a plain one in every location
// (the tiered zone is not announced), and one service per value of
// ratelimit_headers; "all" also has a shadow location.
const rlFieldsPolicy = ptEmbedded + `tiers:
  plan: {key: "{header.x-plan}", values: {free: 10/m, pro: 1000/m}, default: 10/m}
zones:
  tiered: {bucket: "t:{header.x-key}", rate: {tier: plan}, burst: 5}
  per_client: {bucket: "c:{remote_addr}", rate: 2/s, burst: 10}
  no_burst: {bucket: "n:{remote_addr}", rate: 3/m}
defaults:
  limit: [tiered, per_client, no_burst]
services:
  - name: all
    listen: 127.0.0.1:8080
    upstream: 127.0.0.1:8081
    ratelimit_headers: all
    locations:
      - {name: shadow, match: {path_prefix: /shadow}, mode: shadow}
      - {name: api, match: {path_prefix: /}}
  - name: deny-only
    listen: 127.0.0.1:8082
    upstream: 127.0.0.1:8081
  - name: off
    listen: 127.0.0.1:8083
    upstream: 127.0.0.1:8081
    ratelimit_headers: false
`

func rlFieldsService(t testing.TB, p *Policy, name string) *Service {
	t.Helper()
	for _, s := range p.Services {
		if s.Name == name {
			return s
		}
	}
	t.Fatalf("no service %s", name)
	return nil
}

// A location whose first zone is tiered (left out of the RateLimit
// fields) announces the others under their own names with their own
// states: the zones of the answer and of the decision stay aligned.
func TestDenyAnswerSkipsTieredZoneAligned(t *testing.T) {
	p := ptLoad(t, rlFieldsPolicy)
	svc := rlFieldsService(t, p, "deny-only")
	ck := &scriptChecker{res: validResp(wire.StatusOK, false, nil, []wire.ResourceResult{
		{Remaining: 3}, // tiered: quota left
		{Remaining: 0, TokensDeficit: 1, RetryAfterMs: 2500}, // per_client: short
		{Remaining: 1}, // no_burst
	})}
	e := &Engine{Checker: ck}
	var d Decision
	e.Decide(context.Background(), p, svc, testRequest(hdrs{"x-key": "k"}), &d)
	if d.Action != ActionDeny {
		t.Fatalf("action %v cause %v", d.Action, d.Cause)
	}
	a := LocationAnswer(d.Location)
	hs, _, _ := a.RenderDecision(nil, nil, &d)
	m := hdrMap(hs)
	if want := `"per_client";q=2;w=1, "no_burst";q=3;w=60`; m["RateLimit-Policy"] != want {
		t.Errorf("RateLimit-Policy %q, want %q", m["RateLimit-Policy"], want)
	}
	if want := `"per_client";r=0;t=3, "no_burst";r=1;t=0`; m["RateLimit"] != want {
		t.Errorf("RateLimit %q, want %q", m["RateLimit"], want)
	}
	if m["Retry-After"] != "3" {
		t.Errorf("Retry-After %q", m["Retry-After"])
	}
}

// The RateLimit fields of an allowed response: only with
// ratelimit_headers: all, from the decision's own zone states (no check
// beyond the admission's), never for a shadow location.
func TestRenderAllow(t *testing.T) {
	allowed := []wire.ResourceResult{{Remaining: 4}, {Remaining: 3}, {Remaining: 2}}
	for _, c := range []struct {
		name, svc, path string
		fail            FailPolicy
		res             CheckResult
		policy, fields  string // "" = the field is absent
	}{
		{"all", "all", "/x", FailClose, validResp(wire.StatusOK, true, nil, allowed),
			// per_client: (10-3) tokens at 2/s = 3.5s; no_burst: capacity
			// 3 (its rate), (3-2) at 3/min = 20s.
			`"per_client";q=2;w=1, "no_burst";q=3;w=60`, `"per_client";r=3;t=4, "no_burst";r=2;t=20`},
		{"all, full bucket", "all", "/x", FailClose, validResp(wire.StatusOK, true, nil, []wire.ResourceResult{{Remaining: 5}, {Remaining: 10}, {Remaining: 3}}),
			`"per_client";q=2;w=1, "no_burst";q=3;w=60`, `"per_client";r=10;t=0, "no_burst";r=3;t=0`},
		{"all, fail open: nothing known", "all", "/x", FailOpen, CheckResult{Fail: ratelimitly.CauseTimeout},
			`"per_client";q=2;w=1, "no_burst";q=3;w=60`, ""},
		{"all, fail local: the local buckets", "all", "/x", FailLocal, CheckResult{Fail: ratelimitly.CauseTimeout},
			`"per_client";q=2;w=1, "no_burst";q=3;w=60`, `"per_client";r=9;t=1, "no_burst";r=2;t=20`},
		{"all, shadow location", "all", "/shadow", FailClose, validResp(wire.StatusOK, true, nil, allowed), "", ""},
		{"deny only", "deny-only", "/x", FailClose, validResp(wire.StatusOK, true, nil, allowed), "", ""},
		{"off", "off", "/x", FailClose, validResp(wire.StatusOK, true, nil, allowed), "", ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			p := ptLoad(t, rlFieldsPolicy)
			p.RateLimitly.Fail = c.fail
			ck := &scriptChecker{res: c.res}
			e := &Engine{Checker: ck, Local: NewLocalLimiter(nil, 0)}
			r := testRequest(hdrs{"x-key": "k"})
			r.Path = []byte(c.path)
			var d Decision
			e.Decide(context.Background(), p, rlFieldsService(t, p, c.svc), r, &d)
			if d.Action != ActionAdmit || ck.calls != 1 {
				t.Fatalf("action %v cause %v, %d checks", d.Action, d.Cause, ck.calls)
			}
			hs, _ := LocationAnswer(d.Location).RenderAllow(nil, nil, &d)
			m := hdrMap(hs)
			if len(m) != len(hs) || m["RateLimit-Policy"] != c.policy || m["RateLimit"] != c.fields {
				t.Fatalf("fields %v\nwant RateLimit-Policy %q RateLimit %q", m, c.policy, c.fields)
			}
		})
	}
}

// A guard probe (admitted although the guards denied, no zone short)
// carries the zones' states like any allowed response.
func TestRenderAllowGuardProbe(t *testing.T) {
	p := ptLoad(t, strings.Replace(rlFieldsPolicy, "      - {name: api, match: {path_prefix: /}}",
		"      - {name: api, match: {path_prefix: /}, guard: [{tracker: tr, threshold: 100ms}], deny: {guard_probe: 10/s}}", 1)+
		"trackers:\n  tr: {service: s}\n")
	ck := &scriptChecker{res: validResp(wire.StatusOK, false, []wire.GuardResult{{Passed: false, ObservedMs: 900}},
		[]wire.ResourceResult{{Remaining: 4}, {Remaining: 9}, {Remaining: 3}})}
	var d Decision
	(&Engine{Checker: ck}).Decide(context.Background(), p, rlFieldsService(t, p, "all"), testRequest(hdrs{"x-key": "k"}), &d)
	if d.Outcome != OutcomeGuardProbe || d.Action != ActionAdmit {
		t.Fatalf("outcome %v action %v", d.Outcome, d.Action)
	}
	hs, _ := LocationAnswer(d.Location).RenderAllow(nil, nil, &d)
	if got, want := hdrMap(hs)["RateLimit"], `"per_client";r=9;t=1, "no_burst";r=3;t=0`; got != want {
		t.Fatalf("RateLimit %q, want %q", got, want)
	}
}

// refillSeconds at the edges: an empty bucket, remaining above capacity,
// a zero rate, and numbers whose product overflows 64 bits.
func TestRefillSeconds(t *testing.T) {
	for _, c := range []struct {
		res       wire.Resource
		remaining uint32
		want      uint64
	}{
		{wire.Resource{Rate: 1, PeriodMs: 1000, Burst: 5}, 0, 5},
		{wire.Resource{Rate: 3, PeriodMs: 1000}, 0, 1},
		{wire.Resource{Rate: 3, PeriodMs: 1000}, 7, 0},
		{wire.Resource{Rate: 0, PeriodMs: 1000, Burst: 5}, 0, 0},
		{wire.Resource{Rate: 7, PeriodMs: 1, Burst: 5}, 4, 1}, // under a millisecond: 1s
		{wire.Resource{Rate: 1, PeriodMs: 4294967295, Burst: 4294967295}, 0, 4294968},
	} {
		if got := refillSeconds(&c.res, c.remaining); got != c.want {
			t.Errorf("%+v remaining %d: %d, want %d", c.res, c.remaining, got, c.want)
		}
	}
}

// ratelimit_headers takes true, false or all, is inherited from
// defaults, and refuses anything else with the values it takes.
func TestLoadRateLimitHeaders(t *testing.T) {
	for _, c := range []struct {
		defaults, own string
		want          RateLimitFields
	}{
		{"", "", RateLimitFieldsDeny},
		{"", "true", RateLimitFieldsDeny},
		{"", "false", RateLimitFieldsOff},
		{"", "all", RateLimitFieldsAll},
		{"", "ALL", RateLimitFieldsAll},
		{"all", "", RateLimitFieldsAll},
		{"all", "false", RateLimitFieldsOff},
		{"false", "true", RateLimitFieldsDeny},
	} {
		pol := ptEmbedded
		if c.defaults != "" {
			pol += "defaults:\n  ratelimit_headers: " + c.defaults + "\n"
		}
		pol += ptService
		if c.own != "" {
			pol += "    ratelimit_headers: " + c.own + "\n"
		}
		if got := ptLoad(t, pol).Services[0].RateLimitHeaders; got != c.want {
			t.Errorf("defaults %q own %q: %v, want %v", c.defaults, c.own, got, c.want)
		}
	}
	for _, c := range []struct{ value, want string }{
		{`"true"`, `want true, false or all, got string "true"`},
		{"yes", `want true, false or all, got string "yes"`},
		{"deny", `want true, false or all, got string "deny"`},
		{"1", "want true, false or all, got integer 1"},
		{"[all]", "want true, false or all, got a list"},
		{"", "want true, false or all, got null"},
	} {
		_, err := Load(ptWrite(t, ptEmbedded+ptService+"    ratelimit_headers: "+c.value+"\n", ""))
		if err == nil || !strings.Contains(err.Error(), "6: services[0] (web).ratelimit_headers: "+c.want) {
			t.Errorf("%q: %v\nwant %q", c.value, err, c.want)
		}
	}
}

func BenchmarkRenderAllow(b *testing.B) {
	p := ptLoad(b, rlFieldsPolicy)
	ck := &scriptChecker{res: validResp(wire.StatusOK, true, nil, []wire.ResourceResult{{Remaining: 4}, {Remaining: 3}, {Remaining: 2}})}
	var d Decision
	(&Engine{Checker: ck}).Decide(context.Background(), p, rlFieldsService(b, p, "all"), testRequest(hdrs{"x-key": "k"}), &d)
	a := LocationAnswer(d.Location)
	hs := make([]httpparse.Header, 0, 2)
	buf := make([]byte, 0, AnswerBufSize)
	b.ReportAllocs()
	for b.Loop() {
		hs, buf = a.RenderAllow(hs[:0], buf[:0], &d)
	}
}

// The most a request can carry: 32 zones with 64-byte names, each at
// the largest numbers. Every zone is in both fields, whole.
func TestRenderAllowManyZones(t *testing.T) {
	spec := AnswerSpec{RateLimitHeaders: true, RateLimitOnAllow: true}
	d := &Decision{}
	for i := range MaxPerRequest {
		spec.Zones = append(spec.Zones, AnswerZone{Name: fmt.Sprintf("%02d%s", i, strings.Repeat("z", 62)), Quota: 4294967295, Window: 4294967295 * time.Millisecond})
		d.Zones = append(d.Zones, ZoneState{Remaining: 0, Known: true})
		d.Req.Resources = append(d.Req.Resources, wire.Resource{Rate: 1, PeriodMs: 4294967295, Burst: 4294967295})
	}
	hs, buf := NewDenyAnswer(spec).RenderAllow(nil, make([]byte, 0, AnswerBufSize), d)
	m := hdrMap(hs)
	items := strings.Split(m["RateLimit"], ", ")
	if len(hs) != 2 || len(items) != MaxPerRequest || len(strings.Split(m["RateLimit-Policy"], ", ")) != MaxPerRequest {
		t.Fatalf("%d fields, %d RateLimit items", len(hs), len(items))
	}
	if want := `"31` + strings.Repeat("z", 62) + `";r=0;t=4294968`; items[31] != want {
		t.Fatalf("last item %q, want %q", items[31], want)
	}
	if len(buf) > 4096 {
		t.Fatalf("values took %d bytes", len(buf))
	}
}
