package admission

import (
	"errors"
	"strings"
	"testing"
	"time"
)

// timeouts.admission: a duration above the request policy's horizon and
// at most MaxAdmissionTimeout, inherited from defaults like the other
// timeouts; every bad value is one located error that says why.
func TestAdmissionTimeoutSetting(t *testing.T) {
	const svc2 = "  - name: api\n    listen: 127.0.0.1:8090\n    upstream: 127.0.0.1:8091\n"
	custom := "ratelimitly:\n  embedded: true\n  request_policy: {name: custom, unit: 5s, replays: 1, replay_gaps: [5s]}\n" // horizon 10s
	cases := []struct {
		name, policy string
		want         []time.Duration // per service, when accepted
		err          string          // "LINE: fragment", when rejected
	}{
		{"unset", ptEmbedded + ptService, []time.Duration{DefaultAdmissionTimeout}, ""},
		{"service", ptEmbedded + ptService + "    timeouts: {admission: 2s}\n", []time.Duration{2 * time.Second}, ""},
		{"defaults inherited and overridden", ptEmbedded + "defaults:\n  timeouts: {admission: 5s}\n" + ptService + svc2 + "    timeouts: {admission: 90s}\n",
			[]time.Duration{5 * time.Second, 90 * time.Second}, ""},
		{"other timeouts keep their own", ptEmbedded + "defaults:\n  timeouts: {header: 1s}\n" + ptService + "    timeouts: {admission: 3s}\n",
			[]time.Duration{3 * time.Second}, ""},
		{"just above the horizon", ptEmbedded + ptService + "    timeouts: {admission: 61ms}\n", []time.Duration{61 * time.Millisecond}, ""},
		{"the maximum", ptEmbedded + ptService + "    timeouts: {admission: 10m}\n", []time.Duration{MaxAdmissionTimeout}, ""},
		{"above a custom horizon", custom + ptService + "    timeouts: {admission: 11s}\n", []time.Duration{11 * time.Second}, ""},

		{"zero", ptEmbedded + ptService + "    timeouts: {admission: 0s}\n", nil,
			"6: services[0] (web).timeouts.admission: duration 0s out of range 1ms..10m0s"},
		{"bare zero", ptEmbedded + ptService + "    timeouts: {admission: 0}\n", nil,
			"6: services[0] (web).timeouts.admission: duration 0s out of range 1ms..10m0s"},
		{"negative", ptEmbedded + ptService + "    timeouts: {admission: -5s}\n", nil,
			"6: services[0] (web).timeouts.admission: duration -5s out of range 1ms..10m0s"},
		{"absurd", ptEmbedded + ptService + "    timeouts: {admission: 24h}\n", nil,
			"6: services[0] (web).timeouts.admission: duration 24h0m0s out of range 1ms..10m0s"},
		{"no unit", ptEmbedded + ptService + "    timeouts: {admission: 70}\n", nil,
			"6: services[0] (web).timeouts.admission: bad duration 70: add a unit"},
		{"not a duration", ptEmbedded + ptService + "    timeouts: {admission: soon}\n", nil,
			`6: services[0] (web).timeouts.admission: bad duration "soon"`},
		{"equal to the horizon", ptEmbedded + ptService + "    timeouts: {admission: 60ms}\n", nil,
			"6: services[0] (web).timeouts.admission: 60ms must exceed the request policy's horizon 60ms (ratelimitly.request_policy standard): a shorter wait answers 503 before the check's failure policy can decide"},
		{"below a custom horizon", custom + ptService + "    timeouts: {admission: 9s}\n", nil,
			"8: services[0] (web).timeouts.admission: 9s must exceed the request policy's horizon 10s (ratelimitly.request_policy custom)"},
		{"in defaults", ptEmbedded + "defaults:\n  timeouts: {admission: 10ms}\n" + ptService + svc2, nil,
			"3: defaults.timeouts.admission: 10ms must exceed the request policy's horizon 60ms"},
		{"unknown timeout", ptEmbedded + ptService + "    timeouts: {admit: 5s}\n", nil,
			`6: services[0] (web).timeouts: unknown key "admit"`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p, err := Parse("policy.yaml", []byte(tc.policy))
			if tc.err != "" {
				var le *LoadError
				if !errors.As(err, &le) {
					t.Fatalf("got %v, want a *LoadError with %q", err, tc.err)
				}
				if len(le.Errs) != 1 || !strings.Contains(err.Error(), "policy.yaml:"+tc.err) {
					t.Fatalf("errors:\n%v\nwant exactly one with %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(p.Services) != len(tc.want) {
				t.Fatalf("%d services, want %d", len(p.Services), len(tc.want))
			}
			for i, s := range p.Services {
				if s.Timeouts.Admission != tc.want[i] {
					t.Errorf("service %s: admission timeout %v, want %v", s.Name, s.Timeouts.Admission, tc.want[i])
				}
				if s.Timeouts.Admission <= p.RateLimitly.Horizon {
					t.Errorf("service %s: admission timeout %v not above the horizon %v", s.Name, s.Timeouts.Admission, p.RateLimitly.Horizon)
				}
			}
		})
	}
}
