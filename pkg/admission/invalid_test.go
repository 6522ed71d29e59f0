package admission

import (
	"context"
	"strings"
	"testing"

	"github.com/rl-tproxy/rl-tproxy/pkg/ratelimitly"
	"github.com/rl-tproxy/rl-tproxy/pkg/ratelimitly/wire"
)

// `invalid: deny` makes a value the client controls unable to switch a
// limit off under fail: open, while an unreachable RateLimitly still
// follows `fail`.
func TestInvalidDeny(t *testing.T) {
	long := strings.Repeat("k", 1100)
	allow := validResp(wire.StatusOK, true, okGuard, okRes)
	timeout := CheckResult{Fail: ratelimitly.CauseTimeout}
	rows := []struct {
		name          string
		rl, zone, trk InvalidPolicy
		fail          FailPolicy
		mode          Mode
		res           CheckResult
		h             hdrs
		outcome       Outcome
		action        Action
		cause         ratelimitly.Cause
	}{
		{"default follows fail: open", InvalidInherit, InvalidInherit, InvalidInherit, FailOpen, ModeEnforce, allow, hdrs{"x-key": long},
			OutcomeFailOpen, ActionAdmit, ratelimitly.CauseInvalidValue},
		{"ratelimitly deny: oversized key", InvalidDeny, InvalidInherit, InvalidInherit, FailOpen, ModeEnforce, allow, hdrs{"x-key": long},
			OutcomeDeny, ActionDeny, ratelimitly.CauseInvalidValue},
		{"ratelimitly deny: missing key", InvalidDeny, InvalidInherit, InvalidInherit, FailOpen, ModeEnforce, allow, hdrs{"x-label": "l"},
			OutcomeDeny, ActionDeny, ratelimitly.CauseInvalidValue},
		{"ratelimitly deny: oversized label", InvalidDeny, InvalidInherit, InvalidInherit, FailOpen, ModeEnforce, allow, hdrs{"x-key": "a", "x-label": strings.Repeat("l", 300)},
			OutcomeDeny, ActionDeny, ratelimitly.CauseInvalidValue},
		{"zone deny overrides ratelimitly fail", InvalidFail, InvalidDeny, InvalidInherit, FailOpen, ModeEnforce, allow, hdrs{"x-key": long},
			OutcomeDeny, ActionDeny, ratelimitly.CauseInvalidValue},
		{"zone fail overrides ratelimitly deny", InvalidDeny, InvalidFail, InvalidInherit, FailOpen, ModeEnforce, allow, hdrs{"x-key": long},
			OutcomeFailOpen, ActionAdmit, ratelimitly.CauseInvalidValue},
		{"tracker deny: empty service", InvalidFail, InvalidInherit, InvalidDeny, FailOpen, ModeEnforce, allow, hdrs{"x-key": "a"},
			OutcomeDeny, ActionDeny, ratelimitly.CauseInvalidValue},
		{"fail: local with deny", InvalidDeny, InvalidInherit, InvalidInherit, FailLocal, ModeEnforce, allow, hdrs{"x-key": long},
			OutcomeDeny, ActionDeny, ratelimitly.CauseInvalidValue},
		{"shadow never rejects", InvalidDeny, InvalidInherit, InvalidInherit, FailOpen, ModeShadow, allow, hdrs{"x-key": long},
			OutcomeShadowDeny, ActionAdmit, ratelimitly.CauseInvalidValue},
		{"unreachable RateLimitly still follows fail", InvalidDeny, InvalidDeny, InvalidDeny, FailOpen, ModeEnforce, timeout, hdrs{"x-key": "a"},
			OutcomeFailOpen, ActionAdmit, ratelimitly.CauseTimeout},
		{"valid key is checked", InvalidDeny, InvalidInherit, InvalidInherit, FailOpen, ModeEnforce, allow, hdrs{"x-key": "a"},
			OutcomeAllow, ActionAdmit, ratelimitly.CauseAllow},
	}
	for _, row := range rows {
		t.Run(row.name, func(t *testing.T) {
			p, svc := testPolicy(t, row.fail, row.mode)
			p.RateLimitly.Invalid = row.rl
			p.Zones[0].Invalid = row.zone
			tr := p.Trackers[0]
			tr.Invalid = row.trk
			if row.name == "tracker deny: empty service" {
				tr.Service = mustTmpl(t, "{header.x-svc}")
			}
			ch := &scriptChecker{res: row.res}
			e := &Engine{Checker: ch, Local: NewLocalLimiter(nil, 0)}
			var d Decision
			e.Decide(context.Background(), p, svc, testRequest(row.h), &d)
			if d.Outcome != row.outcome || d.Action != row.action || d.Cause != row.cause {
				t.Fatalf("outcome %v action %v cause %v; want %v %v %v", d.Outcome, d.Action, d.Cause, row.outcome, row.action, row.cause)
			}
			if row.cause == ratelimitly.CauseInvalidValue && ch.calls != 0 {
				t.Fatal("an invalid value was sent to RateLimitly")
			}
			if row.cause == ratelimitly.CauseInvalidValue && d.Verdict != VerdictNone {
				t.Fatalf("verdict %v: no RateLimitly decision was made", d.Verdict)
			}
		})
	}
}

func TestLoadInvalidKnobAndWarnings(t *testing.T) {
	const zones = "zones:\n  byhdr: {bucket: \"k:{header.x-key}\", rate: 1/m}\n  byip: {bucket: \"ip:{remote_addr}\", rate: 1/s}\n" +
		"trackers:\n  api: {service: \"api:{cookie.sid}\"}\n"
	t.Run("fail open without invalid warns per client-valued template", func(t *testing.T) {
		p := ptLoad(t, "ratelimitly:\n  embedded: true\n  fail: open\n"+zones+ptService)
		if len(p.Warnings) != 2 {
			t.Fatalf("warnings %v", p.Warnings)
		}
		if w := p.Warnings[0]; w.Line != 5 || !strings.Contains(w.Msg, "zones.byhdr.bucket renders {header.x-key}") || !strings.Contains(w.Msg, "invalid: deny") {
			t.Fatalf("warning %+v", w)
		}
		if w := p.Warnings[1]; w.Line != 8 || !strings.Contains(w.Msg, "trackers.api.service renders {cookie.sid}") {
			t.Fatalf("warning %+v", w)
		}
	})
	t.Run("ratelimitly invalid deny silences them", func(t *testing.T) {
		p := ptLoad(t, "ratelimitly:\n  embedded: true\n  fail: open\n  invalid: deny\n"+zones+ptService)
		if len(p.Warnings) != 0 || p.RateLimitly.Invalid != InvalidDeny {
			t.Fatalf("warnings %v invalid %v", p.Warnings, p.RateLimitly.Invalid)
		}
	})
	t.Run("per zone and tracker", func(t *testing.T) {
		p := ptLoad(t, "ratelimitly:\n  embedded: true\n  fail: local\n"+
			"zones:\n  byhdr: {bucket: \"k:{header.x-key}\", rate: 1/m, invalid: deny}\n"+
			"trackers:\n  api: {service: \"api:{query.u}\", invalid: fail}\n"+ptService)
		if p.Zones[0].Invalid != InvalidDeny || p.Trackers[0].Invalid != InvalidFail {
			t.Fatalf("zone %v tracker %v", p.Zones[0].Invalid, p.Trackers[0].Invalid)
		}
		if len(p.Warnings) != 1 || !strings.Contains(p.Warnings[0].Msg, "trackers.api.service renders {query.u}") ||
			!strings.Contains(p.Warnings[0].Msg, "fail: local") {
			t.Fatalf("warnings %v", p.Warnings)
		}
	})
	t.Run("fail close needs no warning", func(t *testing.T) {
		if p := ptLoad(t, "ratelimitly:\n  embedded: true\n  fail: close\n"+zones+ptService); len(p.Warnings) != 0 {
			t.Fatalf("warnings %v", p.Warnings)
		}
	})
	t.Run("bad value", func(t *testing.T) {
		_, err := Load(ptWrite(t, "ratelimitly:\n  embedded: true\n  invalid: maybe\n"+
			"zones:\n  z: {bucket: x, rate: 1/s, invalid: [deny]}\n"+ptService, ""))
		if err == nil || !strings.Contains(err.Error(), `:3: ratelimitly.invalid: want fail or deny, got "maybe"`) ||
			!strings.Contains(err.Error(), ":5: zones.z.invalid: ") {
			t.Fatalf("err %v", err)
		}
	})
}
