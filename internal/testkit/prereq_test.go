package testkit

import (
	"fmt"
	"strings"
	"testing"
)

// recordTB records how a prerequisite check ended the test instead of
// ending it.
type recordTB struct {
	testing.TB
	skipped, failed string
}

func (r *recordTB) Helper() {}
func (r *recordTB) Skip(args ...any) {
	r.skipped = fmt.Sprint(args...)
}
func (r *recordTB) Fatalf(format string, args ...any) {
	r.failed = fmt.Sprintf(format, args...)
}

func TestMissingSkipsOrFails(t *testing.T) {
	for _, tc := range []struct {
		env        string
		wantFailed bool
	}{{"", false}, {"0", false}, {"1", true}, {"yes", true}} {
		t.Run("strict="+tc.env, func(t *testing.T) {
			t.Setenv(StrictEnv, tc.env)
			r := &recordTB{TB: t}
			Missing(r, "needs %s", "wrk")
			got := r.skipped
			if tc.wantFailed {
				got = r.failed
			}
			if (r.failed != "") != tc.wantFailed || (r.skipped != "") == tc.wantFailed {
				t.Fatalf("skipped %q failed %q, want failed=%v", r.skipped, r.failed, tc.wantFailed)
			}
			if !strings.Contains(got, "needs wrk") {
				t.Fatalf("message %q does not name what is missing", got)
			}
			if tc.wantFailed && !strings.Contains(got, StrictEnv) {
				t.Fatalf("failure %q does not name %s", got, StrictEnv)
			}
		})
	}
}

func TestNeedTool(t *testing.T) {
	t.Setenv(StrictEnv, "1")
	r := &recordTB{TB: t}
	if p := NeedTool(r, "sh", "dash"); p == "" || r.failed != "" {
		t.Fatalf("sh: path %q, failed %q", p, r.failed)
	}
	r = &recordTB{TB: t}
	if p := NeedTool(r, "rl-tproxy-no-such-tool", "no-such-package"); p != "" ||
		!strings.Contains(r.failed, "rl-tproxy-no-such-tool") || !strings.Contains(r.failed, "no-such-package") {
		t.Fatalf("missing tool: path %q, failed %q", p, r.failed)
	}
}
