package admission

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/rl-tproxy/rl-tproxy/pkg/ratelimitly"
	"github.com/rl-tproxy/rl-tproxy/pkg/ratelimitly/wire"
)

// shadowPair is testPolicy with a second location, in shadow mode, that
// shares the zone (and matches /shadow).
func shadowPair(t *testing.T, fail FailPolicy) (*Policy, *Service) {
	p, svc := testPolicy(t, fail, ModeEnforce)
	enf := svc.Locations[0]
	sh := &Location{Service: svc, Name: "shadow", Match: Match{Path: "/shadow"}, Limits: enf.Limits, Mode: ModeShadow}
	svc.Locations = []*Location{sh, enf}
	return p, svc
}

// A shadow location checks the buckets of its zones in their shadow
// namespace, with the zone's numbers; an enforced location sharing the
// zone checks the bucket itself.
func TestShadowChecksItsOwnBuckets(t *testing.T) {
	p, svc := shadowPair(t, FailOpen)
	ch := &scriptChecker{res: validResp(wire.StatusOK, true, nil, okRes)}
	e := &Engine{Checker: ch}
	var d Decision
	r := testRequest(hdrs{"x-key": "alice"})
	r.Path = []byte("/shadow")
	e.Decide(context.Background(), p, svc, r, &d)
	if ch.calls != 1 || len(ch.last.Resources) != 1 {
		t.Fatalf("%d checks, %+v", ch.calls, ch.last)
	}
	if res := ch.last.Resources[0]; string(res.Bucket) != ShadowBucketPrefix+"alice" || res.Rate != 1 || res.PeriodMs != 1000 || res.Burst != 2 || res.Cost != 1 {
		t.Fatalf("shadow resource %+v (bucket %q)", res, res.Bucket)
	}
	e.Decide(context.Background(), p, svc, testRequest(hdrs{"x-key": "alice"}), &d)
	if b := string(ch.last.Resources[0].Bucket); b != "alice" {
		t.Fatalf("enforced bucket %q", b)
	}
}

// Shadow requests that would exhaust a zone leave the enforced
// location's tokens alone: with the local buckets deciding (fail: local,
// RateLimitly down), three shadow requests on a burst-2 zone (the third
// a "would deny"), then the enforced location still admits twice.
func TestShadowSpendsNoEnforcedTokens(t *testing.T) {
	p, svc := shadowPair(t, FailLocal)
	e := &Engine{Checker: &scriptChecker{res: CheckResult{Fail: ratelimitly.CauseTimeout}}, Local: NewLocalLimiter(func() time.Time { return time.Unix(1000, 0) }, 0)}
	var d Decision
	for i, want := range []Outcome{OutcomeFailLocal, OutcomeFailLocal, OutcomeShadowDeny} {
		r := testRequest(hdrs{"x-key": "alice"})
		r.Path = []byte("/shadow")
		e.Decide(context.Background(), p, svc, r, &d)
		if d.Outcome != want || d.Action != ActionAdmit {
			t.Fatalf("shadow request %d: %v %v, want %v admitted", i, d.Outcome, d.Action, want)
		}
	}
	for i, want := range []Action{ActionAdmit, ActionAdmit, ActionDeny} {
		e.Decide(context.Background(), p, svc, testRequest(hdrs{"x-key": "alice"}), &d)
		if d.Action != want {
			t.Fatalf("enforced request %d after the shadow ones: %v %v, want %v", i, d.Outcome, d.Action, want)
		}
	}
}

// Abuse: a bucket value that fits the 1024-byte limit alone but not with
// the shadow prefix is an invalid value in a shadow location (never a
// datagram over the limit), and a zone cannot name a bucket in the
// shadow namespace.
func TestShadowBucketLimits(t *testing.T) {
	p, svc := shadowPair(t, FailClose)
	ch := &scriptChecker{res: validResp(wire.StatusOK, true, okGuard, okRes)}
	e := &Engine{Checker: ch}
	var d Decision
	long := strings.Repeat("k", MaxBucketLen-len(ShadowBucketPrefix)+1)
	r := testRequest(hdrs{"x-key": long})
	r.Path = []byte("/shadow")
	e.Decide(context.Background(), p, svc, r, &d)
	if d.Cause != ratelimitly.CauseInvalidValue || d.Outcome != OutcomeShadowDeny || ch.calls != 0 {
		t.Fatalf("shadow with a %d-byte bucket: cause %v outcome %v, %d checks", len(long), d.Cause, d.Outcome, ch.calls)
	}
	e.Decide(context.Background(), p, svc, testRequest(hdrs{"x-key": long}), &d)
	if d.Cause != ratelimitly.CauseAllow || ch.calls != 1 {
		t.Fatalf("enforced with the same bucket: cause %v, %d checks", d.Cause, ch.calls)
	}

	for _, bucket := range []string{`"~shadow/k:{remote_addr}"`, `"~shadow/"`, `"~sha{{dow/x"`} {
		_, err := Parse("p.yaml", []byte(`ratelimitly: {embedded: true}
zones:
  z: {bucket: `+bucket+`, rate: 1/s}
services:
  - {name: web, listen: 127.0.0.1:8080, upstream: 127.0.0.1:8081, limit: [z]}
`))
		wantErr := bucket != `"~sha{{dow/x"`
		if (err != nil) != wantErr || err != nil && !strings.Contains(err.Error(), "p.yaml:3: zones.z.bucket: must not start with \"~shadow/\"") {
			t.Errorf("bucket %s: %v", bucket, err)
		}
	}
}
