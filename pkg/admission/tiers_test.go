package admission

import (
	"context"
	"strings"
	"testing"

	"github.com/rl-tproxy/rl-tproxy/pkg/ratelimitly"
	"github.com/rl-tproxy/rl-tproxy/pkg/ratelimitly/wire"
)

const tierPolicy = ptEmbedded + `tiers:
  plan:
    key: "{header.x-plan}"
    values: {free: 10/m, pro: 1000/m}
    default: 10/m
  plan_burst:
    key: "{header.x-plan}"
    values: {free: 5, pro: 200}
  slow:
    key: "{query.tier}"
    values: {gold: 2s, basic: 250ms}
    default: 500ms
zones:
  per_key:
    bucket: "key:{header.x-key}"
    rate: {tier: plan}
    burst: {tier: plan_burst}
trackers:
  api: {service: "api"}
` + ptService + `    limit: per_key
    guard: [{tracker: api, threshold: {tier: slow}}]
`

func tierRequest(plan, query string) *Request {
	r := testRequest(hdrs{"x-key": "k1", "x-plan": plan})
	r.Query = []byte(query)
	return r
}

// TestTiersRenderPerRequest: rate, burst and threshold come from the
// request's tier key; an unknown key takes the default, and a tier
// without default has no value for it (invalid_value).
func TestTiersRenderPerRequest(t *testing.T) {
	p := ptLoad(t, tierPolicy)
	loc := p.Services[0].Locations[0]
	tests := []struct {
		plan, query         string
		cause               ratelimitly.Cause
		rate, period, burst uint32
		threshold           uint32
	}{
		{"free", "tier=gold", ratelimitly.CauseAllow, 10, 60_000, 5, 2000},
		{"pro", "tier=basic", ratelimitly.CauseAllow, 1000, 60_000, 200, 250},
		{"pro", "", ratelimitly.CauseAllow, 1000, 60_000, 200, 500},               // threshold default
		{"enterprise", "", ratelimitly.CauseInvalidValue, 0, 0, 0, 0},             // rate has a default, burst has none
		{"", "tier=gold", ratelimitly.CauseInvalidValue, 0, 0, 0, 0},              // empty key: no entry, burst has no default
		{strings.Repeat("p", 300), "", ratelimitly.CauseInvalidValue, 0, 0, 0, 0}, // key over MaxTierKeyLen
	}
	for _, tc := range tests {
		var d Decision
		d.Reset()
		got := Build(loc, tierRequest(tc.plan, tc.query), &d)
		if got != tc.cause {
			t.Errorf("plan %q: Build = %v, want %v", tc.plan, got, tc.cause)
			continue
		}
		if got != ratelimitly.CauseAllow {
			continue
		}
		res, g := d.Req.Resources[0], d.Req.Guards[0]
		if res.Rate != tc.rate || res.PeriodMs != tc.period || res.Burst != tc.burst || res.Cost != 1 || g.ThresholdMs != tc.threshold {
			t.Errorf("plan %q query %q: resource %+v threshold %d", tc.plan, tc.query, res, g.ThresholdMs)
		}
		if string(res.Bucket) != "key:k1" || string(g.Service) != "api" {
			t.Errorf("plan %q: bucket %q service %q (the tier key must not leak into rendered strings)", tc.plan, res.Bucket, g.Service)
		}
		if l := d.local[0]; l.Rate != tc.rate || l.Burst != tc.burst {
			t.Errorf("plan %q: local fallback zone %+v", tc.plan, l)
		}
	}
	if a := LocationAnswer(loc); a.PolicyField() != "" && strings.Contains(a.PolicyField(), "per_key") {
		t.Errorf("RateLimit-Policy %q announces a quota for a tiered rate", a.PolicyField())
	}
}

func TestTierLoadErrors(t *testing.T) {
	zone := func(rate string) string {
		return "zones:\n  z: {bucket: b, rate: " + rate + "}\n" + ptService + "    limit: z\n"
	}
	tests := []struct {
		name, policy, want string
	}{
		{"unknown tier", ptEmbedded + zone("{tier: nope}"), `zones.z.rate: unknown tier "nope"`},
		{"rate value not a rate", ptEmbedded + "tiers:\n  t: {key: \"{host}\", values: {a: 10/m, b: 7}}\n" + zone("{tier: t}"),
			`tiers.t.values.b (as zones.z.rate): want a rate such as 100/s`},
		{"default not a rate", ptEmbedded + "tiers:\n  t: {key: \"{host}\", values: {a: 10/m}, default: 10/d}\n" + zone("{tier: t}"),
			`tiers.t.default (as zones.z.rate): bad rate`},
		{"missing key", ptEmbedded + "tiers:\n  t: {values: {a: 10/m}}\n" + zone("{tier: t}"), "tiers.t: missing key"},
		{"missing values", ptEmbedded + "tiers:\n  t: {key: \"{host}\"}\n" + zone("10/m"), "tiers.t: missing values"},
		{"empty values", ptEmbedded + "tiers:\n  t: {key: \"{host}\", values: {}}\n" + zone("10/m"), "tiers.t.values: want a non-empty mapping"},
		{"bad key template", ptEmbedded + "tiers:\n  t: {key: \"{nope}\", values: {a: 1/s}}\n" + zone("10/m"), "tiers.t.key: offset 0: unknown variable"},
		{"unknown key", ptEmbedded + "tiers:\n  t: {key: \"{host}\", value: {a: 1/s}}\n" + zone("10/m"), `tiers.t: unknown key "value"`},
		{"extra key beside tier", ptEmbedded + "tiers:\n  t: {key: \"{host}\", values: {a: 1/s}}\n" + zone("{tier: t, x: 1}"), `zones.z.rate: unknown key "x"`},
		{"duplicate tier key", ptEmbedded + "tiers:\n  t: {key: \"{host}\", values: {a: 1/s, a: 2/s}}\n" + zone("{tier: t}"), `duplicate key "a"`},
		{"cost over capacity for one key", ptEmbedded + "tiers:\n  t: {key: \"{host}\", values: {small: 2/s, big: 100/s}}\n" +
			"zones:\n  z: {bucket: b, rate: {tier: t}, cost: 5}\n" + ptService + "    limit: z\n",
			"zones.z: cost 5 exceeds the bucket capacity 2 (burst, or rate when burst is 0) for tier key small"},
		{"cost tier over capacity of another tier", ptEmbedded + "tiers:\n  r: {key: \"{host}\", values: {a: 2/s}}\n  c: {key: \"{method}\", values: {GET: 1, POST: 3}}\n" +
			"zones:\n  z: {bucket: b, rate: {tier: r}, cost: {tier: c}}\n" + ptService + "    limit: z\n",
			"zones.z: a cost of 3 can exceed the smallest bucket capacity 2"},
		{"threshold not whole ms", ptEmbedded + "tiers:\n  t: {key: \"{host}\", values: {a: 1500us}}\ntrackers:\n  tr: {service: s}\n" + ptService +
			"    guard: [{tracker: tr, threshold: {tier: t}}]\n", "tiers.t.values.a (as services[0] (web).guard[0].threshold): must be whole milliseconds"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Load(ptWrite(t, tc.policy, ""))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v\nwant it to contain %q", err, tc.want)
			}
		})
	}
}

// TestTierValueErrorReportedOnce: a tier used by several zones for the
// same kind of number reports a bad value once.
func TestTierValueErrorReportedOnce(t *testing.T) {
	pol := ptEmbedded + "tiers:\n  t: {key: \"{host}\", values: {a: nope}}\n" +
		"zones:\n  z1: {bucket: b, rate: {tier: t}}\n  z2: {bucket: c, rate: {tier: t}}\n" + ptService + "    limit: [z1, z2]\n"
	_, err := Load(ptWrite(t, pol, ""))
	if err == nil || strings.Count(err.Error(), "bad rate") != 1 {
		t.Fatalf("err = %v, want one bad-rate error", err)
	}
}

// TestTierMissFollowsInvalid: a tier key without a value is an invalid
// value: under fail: open it is admitted unchecked unless the zone says
// invalid: deny.
func TestTierMissFollowsInvalid(t *testing.T) {
	for _, tc := range []struct {
		invalid string
		outcome Outcome
	}{{"fail", OutcomeFailOpen}, {"deny", OutcomeDeny}} {
		pol := "ratelimitly: {embedded: true, fail: open}\ntiers:\n  plan: {key: \"{header.x-plan}\", values: {pro: 100/s}}\n" +
			"zones:\n  z: {bucket: b, rate: {tier: plan}, invalid: " + tc.invalid + "}\n" + ptService + "    limit: z\n"
		p := ptLoad(t, pol)
		svc := p.Services[0]
		ch := &scriptChecker{res: validResp(wire.StatusOK, true, nil, okRes)}
		e := &Engine{Checker: ch}
		var d Decision
		e.Decide(context.Background(), p, svc, tierRequest("free", ""), &d)
		if d.Outcome != tc.outcome || d.Cause != ratelimitly.CauseInvalidValue {
			t.Errorf("invalid: %s: outcome %v cause %v, want %v invalid_value", tc.invalid, d.Outcome, d.Cause, tc.outcome)
		}
		e.Decide(context.Background(), p, svc, tierRequest("pro", ""), &d)
		if d.Outcome != OutcomeAllow || d.Req.Resources[0].Rate != 100 {
			t.Errorf("invalid: %s: pro key: outcome %v resource %+v", tc.invalid, d.Outcome, d.Req.Resources)
		}
	}
}
