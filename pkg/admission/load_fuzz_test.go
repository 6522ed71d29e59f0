package admission

import (
	"errors"
	"net/netip"
	"os"
	"regexp"
	"strings"
	"testing"
)

var ptFuzzLine = regexp.MustCompile(`^(fuzz|creds)\.yaml:[0-9]+: \S`)

// ptFuzzRead serves one valid credentials file from memory, so the fuzzer
// never touches the file system.
func ptFuzzRead(path string) ([]byte, error) {
	if path == "creds.yaml" {
		return []byte("tenant: t\nkey_id: 1\nsecret: " + ptSecret + "\nmax_horizon: 1s\n"), nil
	}
	return nil, &os.PathError{Op: "open", Path: path, Err: os.ErrNotExist}
}

// FuzzLoad: the loader never panics; it either returns a *LoadError whose
// every line is FILE:LINE: message, or a complete policy whose invariants
// hold and whose matching and templates run.
func FuzzLoad(f *testing.F) {
	for _, s := range []string{
		ptEmbedded + ptService,
		ptMatchPolicy,
		"ratelimitly: {srv: _rl._udp.x, credentials: creds.yaml, request_policy: {name: custom, unit: 5ms, replays: 2, replay_gaps: [5ms]}}\n" + ptService,
		ptEmbedded + "zones:\n  z: {bucket: \"{remote_addr}{{\", rate: 5/m, burst: 9, cost: 2}\ntrackers:\n  t: {service: \"s:{host}\"}\n" + ptService + "    guard: [{tracker: t, threshold: 5ms}]\n    report: t\n    limit: z\n",
		"services: [\n",
		"ratelimitly: {embedded: true, request_policy: {name: single_round, unit: 2s}}\ndefaults:\n  timeouts: {admission: 3s}\n" + ptService + "    timeouts: {admission: 2s}\n",
		tierPolicy,
		rlFieldsPolicy,
	} {
		f.Add([]byte(s))
	}
	r := ptRequest()
	f.Fuzz(func(t *testing.T, data []byte) {
		p, err := parse("fuzz.yaml", data, ptFuzzRead)
		if err != nil {
			var le *LoadError
			if !errors.As(err, &le) || len(le.Errs) == 0 {
				t.Fatalf("error %T %v is not a non-empty *LoadError", err, err)
			}
			for _, line := range strings.Split(err.Error(), "\n") {
				if !ptFuzzLine.MatchString(line) {
					t.Fatalf("unlocated error %q", line)
				}
			}
			return
		}
		if len(p.Services) == 0 || (!p.RateLimitly.Embedded && p.RateLimitly.SRV == "") {
			t.Fatal("accepted a policy without services or ratelimitly target")
		}
		if p.RateLimitly.Horizon > WireMaxTTL {
			t.Fatalf("accepted horizon %v", p.RateLimitly.Horizon)
		}
		_ = p.Summary()
		for _, w := range p.Warnings {
			if !ptFuzzLine.MatchString(w.Error()) {
				t.Fatalf("unlocated warning %q", w.Error())
			}
		}
		buf := make([]byte, 0, 2048)
		for _, s := range p.Services {
			for _, ap := range s.Listen {
				if p.ServiceFor(ap) == nil {
					t.Fatalf("ServiceFor(%v) = nil for a listen address", ap)
				}
			}
			_ = p.ServiceFor(netip.AddrPortFrom(netip.MustParseAddr("10.0.0.1"), s.Port))
			if a := s.Timeouts.Admission; a <= p.RateLimitly.Horizon || a > MaxAdmissionTimeout {
				t.Fatalf("service %s: accepted admission timeout %v (horizon %v)", s.Name, a, p.RateLimitly.Horizon)
			}
			_ = s.Match(r)
			if s.RateLimitHeaders > RateLimitFieldsAll {
				t.Fatalf("service %s: ratelimit_headers %d", s.Name, s.RateLimitHeaders)
			}
			for _, l := range s.Locations {
				if a := LocationAnswer(l); len(a.names) != len(l.Limits) {
					t.Fatalf("location %s: answer names %d zones, the location has %d", l.Name, len(a.names), len(l.Limits))
				}
				if len(l.Limits) > MaxPerRequest || len(l.Guards) > MaxPerRequest || l.Deny.Status < 400 || l.Deny.Status > 599 {
					t.Fatalf("location %+v out of limits", l)
				}
				for _, z := range l.Limits {
					if z.Bucket == nil || (z.Rate == 0) == (z.RateTier == nil) || (z.Cost == 0) == (z.CostTier == nil) {
						t.Fatalf("zone %+v incomplete", z)
					}
					buf, _ = z.Bucket.Render(buf[:0], r)
					if z.Tiered() {
						var rate, period, cost uint32
						var ok bool
						if buf, rate, period, _, cost, ok = z.numbers(buf[:0], r); ok && (rate == 0 || period == 0 || cost == 0) {
							t.Fatalf("zone %+v rendered rate %d/%dms cost %d", z, rate, period, cost)
						}
					}
				}
				for _, g := range l.Guards {
					if g.Tracker == nil || g.Tracker.Service == nil || (g.ThresholdMs == 0) == (g.ThresholdTier == nil) {
						t.Fatalf("guard %+v incomplete", g)
					}
				}
				if l.Label != nil {
					buf, _ = l.Label.Render(buf[:0], r)
				}
			}
		}
	})
}

// FuzzTemplate: compile never panics; a compiled template renders within
// its literal lower bound, and a static template renders its source with
// the brace escapes undone.
func FuzzTemplate(f *testing.F) {
	for _, s := range []string{"", "static", "{remote_addr}", "a{{b}}c", "{header.x-api-key}:{cookie.sid}", "{query.a}{", "}", "{host}{path}{method}"} {
		f.Add(s)
	}
	r := ptRequest()
	f.Fuzz(func(t *testing.T, src string) {
		tm, err := CompileTemplate(src)
		if err != nil {
			return
		}
		out, err := tm.Render(nil, r)
		if err != nil {
			t.Fatalf("render without limits failed: %v", err)
		}
		if len(out) < tm.StaticLen() {
			t.Fatalf("rendered %d bytes, below the static length %d", len(out), tm.StaticLen())
		}
		if tm.Static() {
			want := strings.NewReplacer("{{", "{", "}}", "}").Replace(src)
			if string(out) != want {
				t.Fatalf("static %q rendered %q, want %q", src, out, want)
			}
		}
	})
}

// FuzzNormalizePath: a normalized path starts with '/', has no empty, "."
// or ".." segments and no escaped slash, and normalizing it again changes
// nothing.
func FuzzNormalizePath(f *testing.F) {
	for _, s := range []string{"/", "/a//b/./c/../d", "/%61%2e%2E/x", "/x%", "/..", "api", "/api%2fx", "/a/b%2F..%2f..%2Fc", "/a%5C..%5cb", "/%2"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, p []byte) {
		out, ok := NormalizePath(nil, p)
		if !ok {
			if len(out) != 0 {
				t.Fatalf("failed normalization wrote %q", out)
			}
			return
		}
		if len(out) == 0 || out[0] != '/' {
			t.Fatalf("%q -> %q does not start with /", p, out)
		}
		segs := strings.Split(string(out[1:]), "/")
		for i, s := range segs {
			if s == "." || s == ".." || (s == "" && i != len(segs)-1) {
				t.Fatalf("%q -> %q keeps segment %q", p, out, s)
			}
		}
		if strings.Contains(strings.ToUpper(string(out)), "%2F") {
			t.Fatalf("%q -> %q keeps an escaped slash", p, out)
		}
		again, ok := NormalizePath(nil, out)
		if !ok || string(again) != string(out) {
			t.Fatalf("not idempotent: %q -> %q -> %q (%v)", p, out, again, ok)
		}
	})
}
