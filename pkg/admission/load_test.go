package admission

import (
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/rl-tproxy/rl-tproxy/pkg/ratelimitly"
)

// ptSecret is a test-only key (32 bytes, base64).
const ptSecret = "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8="

// ptWrite writes a policy (and optional credentials file named creds.yaml)
// into a fresh directory and returns the policy path.
func ptWrite(t testing.TB, policy, creds string) string {
	t.Helper()
	dir := t.TempDir()
	if creds != "" {
		if err := os.WriteFile(filepath.Join(dir, "creds.yaml"), []byte(creds), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	p := filepath.Join(dir, "policy.yaml")
	if err := os.WriteFile(p, []byte(policy), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

const ptEmbedded = "ratelimitly: {embedded: true}\n"

// ptService is a minimal valid service block to append zones etc. to.
const ptService = "services:\n  - name: web\n    listen: 127.0.0.1:8080\n    upstream: 127.0.0.1:8081\n"

func ptLoad(t testing.TB, policy string) *Policy {
	t.Helper()
	p, err := Load(ptWrite(t, policy, ""))
	if err != nil {
		t.Fatalf("load: %v\n--- policy ---\n%s", err, policy)
	}
	return p
}

func TestLoadExamplePolicy(t *testing.T) {
	p, err := Load("../../examples/policy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	rl := p.RateLimitly
	if !rl.Embedded || rl.GeneratedCredential || rl.Credential.Tenant != "demo" || rl.Horizon != 60*time.Millisecond || rl.Fail != FailOpen {
		t.Fatalf("ratelimitly block: %+v", rl)
	}
	if rl.CredentialsFile != filepath.Join("../../examples", "credentials.yaml") {
		t.Errorf("credentials path %q not resolved against the policy dir", rl.CredentialsFile)
	}
	if len(p.Services) != 1 {
		t.Fatalf("services %d", len(p.Services))
	}
	s := p.Services[0]
	if s.Name != "web" || s.Upstream != "127.0.0.1:8081" || len(s.Listen) != 1 || s.Listen[0] != netip.MustParseAddrPort("127.0.0.1:8080") {
		t.Fatalf("service %+v", s)
	}
	if !s.Forward.XForwardedFor || !s.Forward.XRealIP || s.Forward.Forwarded || s.Forward.XForwardedProto {
		t.Errorf("forwarded headers %+v", s.Forward)
	}
	byName := map[string]*Location{}
	for _, l := range s.Locations {
		byName[l.Name] = l
	}
	if h := byName["health"]; h == nil || h.Protected() || h.Report != nil {
		t.Errorf("health location %+v", h)
	}
	if a := byName["api"]; a == nil || !a.Protected() || len(a.Limits) != 1 || a.Limits[0].Name != "per_client" || a.Label.String() != "api" || a.Deny.Status != 429 {
		t.Errorf("api location %+v", a)
	}
	c := byName["checkout"]
	if c == nil || len(c.Guards) != 1 || c.Guards[0].ThresholdMs != 250 || c.Report == nil || c.Report.Name != "checkout" || c.Deny.Status != 503 || c.Match.Methods[0] != "POST" {
		t.Errorf("checkout location %+v", c)
	}
	if z := p.Zone("per_client"); z == nil || z.Rate != 10 || z.PeriodMs != 1000 || z.Burst != 20 || z.Cost != 1 {
		t.Errorf("zone %+v", z)
	}
	if z := p.Zone("checkout_global"); z == nil || z.Rate != 600 || z.PeriodMs != 60000 {
		t.Errorf("zone %+v", z)
	}
	if got := p.ServiceFor(netip.MustParseAddrPort("127.0.0.1:8080")); got != s {
		t.Errorf("ServiceFor listen address = %v", got)
	}
	if v2 := byName["v2"]; v2 == nil || len(v2.Limits) != 1 || v2.Limits[0].RateTier == nil || len(p.Tiers) != 1 || p.Tiers[0].Name != "plan" {
		t.Errorf("v2 location %+v, tiers %+v: want per_key with its rate from tier plan", v2, p.Tiers)
	}
	if !strings.Contains(p.Summary(), "1 service, 4 locations (3 protected), 3 zones, 1 tracker") {
		t.Errorf("summary %q", p.Summary())
	}
}

// Each case must fail with exactly the listed FILE:LINE: message fragments.
func TestLoadErrors(t *testing.T) {
	long := strings.Repeat("b", 2000)
	creds100 := "tenant: t\nkey_id: 4\nsecret: " + ptSecret + "\nmax_horizon: 100ms\n"
	cases := []struct {
		name, policy, creds string
		want                []string // "LINE: fragment"
	}{
		// The must-show cases.
		{"unknown key", ptEmbedded + ptService + "    colour: blue\n", "", []string{`6: services[0] (web): unknown key "colour"`}},
		{"bad rate", ptEmbedded + "zones:\n  z: {bucket: x, rate: 10/d}\n" + ptService, "", []string{`3: zones.z.rate: bad rate "10/d"`}},
		{"unknown template variable", ptEmbedded + "zones:\n  z: {bucket: \"c:{remote_ip}\", rate: 1/s}\n" + ptService, "", []string{"3: zones.z.bucket: offset 2: unknown variable {remote_ip}"}},
		{"2000-byte static bucket", ptEmbedded + "zones:\n  z:\n    rate: 1/s\n    bucket: " + long + "\n" + ptService, "", []string{"5: zones.z.bucket: static value is 2000 bytes, over the 1024-byte limit"}},
		{"300-byte label", ptEmbedded + ptService + "    label: " + strings.Repeat("l", 300) + "\n", "", []string{"6: services[0] (web).label: static value is 300 bytes, over the 256-byte limit"}},
		{"custom horizon over max_horizon", "ratelimitly:\n  embedded: true\n  credentials: creds.yaml\n  request_policy:\n    name: custom\n    unit: 40ms\n    replays: 2\n    replay_gaps: [30ms]\n    final_receive: 20ms\n" + ptService, creds100,
			[]string{"5: ratelimitly.request_policy: request policy custom: horizon 120ms exceeds the credential's max_horizon 100ms (credential key_id 4 in "}},

		// Wrong types, durations, names.
		{"bool as string", ptEmbedded + ptService + "    ratelimit_headers: \"yes\"\n", "", []string{`6: services[0] (web).ratelimit_headers: want true, false or all, got string "yes"`}},
		{"bad duration", ptEmbedded + ptService + "    timeouts: {header: 10 seconds}\n", "", []string{`6: services[0] (web).timeouts.header: bad duration "10 seconds"`}},
		{"duration without unit", ptEmbedded + ptService + "    timeouts: {idle: 30}\n", "", []string{"6: services[0] (web).timeouts.idle: bad duration 30: add a unit"}},
		{"port out of range", ptEmbedded + "services:\n  - name: web\n    port: 70000\n    upstream: 127.0.0.1:80\n", "", []string{"4: services[0] (web).port: want an integer from 1 to 65535, got 70000"}},
		{"port and listen", ptEmbedded + ptService + "    port: 80\n", "", []string{"4: services[0] (web): set either port (steered) or listen"}},
		{"neither port nor listen", ptEmbedded + "services:\n  - name: web\n    upstream: 127.0.0.1:80\n", "", []string{"3: services[0] (web): set port (steered by sk_lookup) or listen"}},
		{"missing upstream", ptEmbedded + "services:\n  - name: web\n    port: 80\n", "", []string{"3: services[0] (web): missing upstream"}},
		{"bad upstream", ptEmbedded + "services:\n  - name: web\n    port: 80\n    upstream: localhost\n", "", []string{`5: services[0] (web).upstream: bad address "localhost": want host:port`}},
		{"bad listen", ptEmbedded + "services:\n  - name: web\n    listen: [127.0.0.1:8080, nowhere]\n    upstream: 127.0.0.1:80\n", "", []string{`4: services[0] (web).listen: want IP:port`}},
		{"missing ratelimitly", ptService, "", []string{"1: missing ratelimitly block"}},
		{"srv and embedded", "ratelimitly:\n  srv: _rl._udp.example\n  embedded: true\n" + ptService, "", []string{"3: ratelimitly: set either srv or embedded: true, not both"}},
		{"neither srv nor embedded", "ratelimitly: {fail: open}\n" + ptService, "", []string{"1: ratelimitly: set srv"}},
		{"srv without credentials", "ratelimitly:\n  srv: _rl._udp.example\n" + ptService, "", []string{"2: ratelimitly: credentials is required with srv"}},
		{"missing credentials file", "ratelimitly:\n  srv: _rl._udp.example\n  credentials: nope.yaml\n" + ptService, "", []string{"3: ratelimitly.credentials: cannot read", "nope.yaml: no such file or directory"}},
		{"bad credentials file", "ratelimitly:\n  srv: _rl._udp.example\n  credentials: creds.yaml\n" + ptService, "tenant: t\nkey_id: 1\nsecret: AAAA\n", []string{"creds.yaml:3: secret: decodes to the wrong length", "policy.yaml:3: ratelimitly.credentials:"}},
		{"bad fail", "ratelimitly: {embedded: true, fail: maybe}\n" + ptService, "", []string{`1: ratelimitly.fail: want open, close or local, got "maybe"`}},
		{"bad bind", "ratelimitly: {embedded: true, bind: 0.0.0.0:53}\n" + ptService, "", []string{"1: ratelimitly.bind: want an IP address"}},
		{"resolver with embedded", "ratelimitly: {embedded: true, resolver: 10.0.0.1}\n" + ptService, "", []string{"1: ratelimitly: resolver settings apply to srv discovery"}},
		{"bad resolver", "ratelimitly:\n  srv: _rl._udp.example\n  credentials: creds.yaml\n  resolver: dns.example:53\n" + ptService, "tenant: t\nkey_id: 1\nsecret: " + ptSecret + "\n", []string{"4: ratelimitly.resolver: want IP or IP:port"}},
		{"standard with replays", "ratelimitly:\n  embedded: true\n  request_policy: {name: standard, replays: 2}\n" + ptService, "", []string{"3: ratelimitly.request_policy.replays: only for name: custom"}},
		{"unknown policy name", "ratelimitly:\n  embedded: true\n  request_policy: {name: fast}\n" + ptService, "", []string{`3: ratelimitly.request_policy.name: want standard, single_round or custom, got "fast"`}},
		{"custom too many replays", "ratelimitly:\n  embedded: true\n  request_policy:\n    name: custom\n    replays: 17\n" + ptService, "", []string{"5: ratelimitly.request_policy.replays: want an integer from 0 to 16, got 17"}},
		{"custom more gaps than replays", "ratelimitly:\n  embedded: true\n  request_policy:\n    name: custom\n    replays: 1\n    replay_gaps: [1ms, 2ms]\n" + ptService, "", []string{"6: ratelimitly.request_policy: replay_gaps lists 2 gaps but replays is 1"}},
		{"horizon over wire TTL", "ratelimitly:\n  embedded: true\n  request_policy: {name: standard, unit: 30s}\n" + ptService, "", []string{"3: ratelimitly.request_policy: request policy standard: horizon 1m30s exceeds the wire limit of 65535ms"}},
		{"standard over max_horizon", "ratelimitly:\n  embedded: true\n  credentials: creds.yaml\n  request_policy: {name: standard, unit: 40ms}\n" + ptService, creds100, []string{"4: ratelimitly.request_policy: request policy standard: horizon 120ms exceeds the credential's max_horizon 100ms"}},
		{"zone missing fields", ptEmbedded + "zones:\n  z: {burst: 3}\n" + ptService, "", []string{"3: zones.z: missing bucket", "3: zones.z: missing rate"}},
		{"cost over capacity", ptEmbedded + "zones:\n  z: {bucket: x, rate: 5/s, cost: 6}\n" + ptService, "", []string{"3: zones.z: cost 6 exceeds the bucket capacity 5"}},
		{"empty bucket", ptEmbedded + "zones:\n  z: {bucket: \"\", rate: 5/s}\n" + ptService, "", []string{"3: zones.z.bucket: must not be empty"}},
		{"bad zone name", ptEmbedded + "zones:\n  \"a b\": {bucket: x, rate: 5/s}\n" + ptService, "", []string{`3: zones: bad name "a b"`}},
		{"tracker bad template", ptEmbedded + "trackers:\n  t: {service: \"s:{header.}\"}\n" + ptService, "", []string{"3: trackers.t.service: offset 2: variable {header.} needs a name"}},
		{"unknown zone", ptEmbedded + ptService + "    limit: [nope]\n", "", []string{`6: services[0] (web).(implicit location): limit: unknown zone "nope"`}},
		{"unknown tracker in guard and report", ptEmbedded + ptService + "    locations:\n      - guard: [{tracker: t1, threshold: 10ms}]\n        report: t2\n", "", []string{`7: services[0] (web).locations[0]: guard: unknown tracker "t1"`, `8: services[0] (web).locations[0]: report: unknown tracker "t2"`}},
		{"guard without threshold", ptEmbedded + "trackers:\n  t: {service: s}\n" + ptService + "    guard: [{tracker: t}]\n", "", []string{"8: services[0] (web).guard[0]: missing threshold"}},
		{"bad mode", ptEmbedded + ptService + "    mode: dry\n", "", []string{`6: services[0] (web).mode: want enforce or shadow, got "dry"`}},
		{"bad deny status", ptEmbedded + ptService + "    deny: {status: 200}\n", "", []string{"6: services[0] (web).deny.status: want an integer from 400 to 599, got 200"}},
		{"bad method", ptEmbedded + ptService + "    locations:\n      - match: {methods: [get]}\n", "", []string{`7: services[0] (web).locations[0].match.methods: bad method "get"`}},
		{"path and prefix", ptEmbedded + ptService + "    locations:\n      - match: {path: /a, path_prefix: /b}\n", "", []string{"7: services[0] (web).locations[0].match: set path or path_prefix, not both"}},
		{"bad header match", ptEmbedded + ptService + "    locations:\n      - match:\n          headers: {X-A: [1]}\n", "", []string{"8: services[0] (web).locations[0].match.headers.X-A: want true (present), false (absent) or a string"}},
		{"duplicate key", ptEmbedded + ptService + "    upstream: 127.0.0.1:9\n", "", []string{`6: services[0] (web): duplicate key "upstream"`}},
		{"duplicate service", ptEmbedded + ptService + "  - name: web\n    listen: 127.0.0.1:9090\n    upstream: 127.0.0.1:8081\n", "", []string{`6: services: duplicate service name "web" (first at line 3)`}},
		{"listen conflict", ptEmbedded + ptService + "  - name: b\n    listen: 0.0.0.0:8080\n    upstream: 127.0.0.1:8081\n", "", []string{"6: services (b): listen 0.0.0.0:8080 conflicts with 127.0.0.1:8080"}},
		{"steer conflict", ptEmbedded + "services:\n  - {name: a, port: 80, upstream: 127.0.0.1:80}\n  - {name: b, port: 80, upstream: 127.0.0.1:80, prefixes: [10.0.0.0/8]}\n", "", []string{`4: services (b): port 80 is already steered to service "a"`}},
		{"upstream loop", ptEmbedded + "services:\n  - name: web\n    listen: 127.0.0.1:8080\n    upstream: 127.0.0.1:8080\n", "", []string{"3: services (web): upstream 127.0.0.1:8080 is the proxy's own listener"}},
		{"too many zones", ptEmbedded + "zones:\n" + ptZones(33) + ptService + "    limit: [" + ptZoneNames(33) + "]\n", "", []string{"services[0] (web).(implicit location): 33 zones, more than the 32"}},
		{"datagram too large", ptEmbedded + "zones:\n  a: {bucket: \"" + strings.Repeat("a", 700) + "{path}\", rate: 1/s}\n  b: {bucket: \"" + strings.Repeat("b", 700) + "{path}\", rate: 1/s}\n" + ptService + "    limit: [a, b]\n", "", []string{"over the 1400-byte datagram limit"}},
		{"alias", ptEmbedded + "x: &a 1\n" + ptService, "", []string{`2: policy: unknown key "x"`}},
		{"alias value", ptEmbedded + "zones:\n  z: &z {bucket: x, rate: 1/s}\n  y: *z\n" + ptService, "", []string{"4: zones.y: YAML aliases are not supported"}},
		{"syntax error", ptEmbedded + "services: [\n", "", []string{"policy.yaml:"}},
		{"empty file", "", "", []string{"1: empty policy file"}},
		{"no services", ptEmbedded, "", []string{"1: missing services"}},
		{"two documents", ptEmbedded + ptService + "---\nzones: {}\n", "", []string{"6: more than one YAML document"}},
		{"null value", ptEmbedded + ptService + "    label: ~\n", "", []string{"6: services[0] (web).label: want a string, got null"}},
	}
	lineRE := regexp.MustCompile(`^\S+:[0-9]+: \S`)
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			path := ptWrite(t, tc.policy, tc.creds)
			p, err := Load(path)
			if err == nil {
				t.Fatalf("accepted:\n%s\nsummary: %s", tc.policy, p.Summary())
			}
			var le *LoadError
			if !errors.As(err, &le) {
				t.Fatalf("error %T is not *LoadError: %v", err, err)
			}
			msg := err.Error()
			for _, line := range strings.Split(msg, "\n") {
				if !lineRE.MatchString(line) {
					t.Errorf("error line %q is not FILE:LINE: message", line)
				}
			}
			for _, w := range tc.want {
				if w[0] >= '0' && w[0] <= '9' {
					w = path + ":" + w
				}
				if !strings.Contains(msg, w) {
					t.Errorf("missing %q in:\n%s", w, msg)
				}
			}
		})
	}
}

func ptZones(n int) string {
	var b strings.Builder
	for i := 0; i < n; i++ {
		b.WriteString("  z" + itoa(i) + ": {bucket: \"{remote_addr}\", rate: 1/s}\n")
	}
	return b.String()
}

func ptZoneNames(n int) string {
	names := make([]string, n)
	for i := range names {
		names[i] = "z" + itoa(i)
	}
	return strings.Join(names, ", ")
}

// Every error of a file is reported, not just the first.
func TestLoadCollectsAllErrors(t *testing.T) {
	src := `ratelimitly:
  embedded: true
  fail: sometimes
zones:
  a: {bucket: "{nope}", rate: 1/x}
  b: {bucket: x, rate: 1/s, extra: 1}
services:
  - name: web
    port: 0
    upstream: 127.0.0.1:80
    label: "` + strings.Repeat("x", 257) + `"
    locations:
      - match: {path: nope}
        limit: [missing]
`
	_, err := Load(ptWrite(t, src, ""))
	var le *LoadError
	if !errors.As(err, &le) {
		t.Fatalf("err %v", err)
	}
	wantLines := []int{3, 5, 5, 6, 9, 11, 13, 14}
	var got []int
	for _, e := range le.Errs {
		got = append(got, e.Line)
	}
	if len(got) != len(wantLines) {
		t.Fatalf("got %d errors (lines %v), want lines %v:\n%v", len(got), got, wantLines, err)
	}
	for i := range got {
		if got[i] != wantLines[i] {
			t.Fatalf("error lines %v, want %v (sorted by line):\n%v", got, wantLines, err)
		}
	}
}

func TestLoadNonRegularFile(t *testing.T) {
	if _, err := Load("/dev/null"); err == nil || !strings.Contains(err.Error(), "not a regular file") {
		t.Fatalf("err %v", err)
	}
	if _, err := Load(filepath.Join(t.TempDir(), "missing.yaml")); err == nil || !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("err %v", err)
	}
}

func TestLoadSRVWithCredentials(t *testing.T) {
	creds := "tenant: acme\nkey_id: 9\nsecret: " + ptSecret + "\nmax_horizon: 1s\n"
	policy := `ratelimitly:
  srv: _ratelimitly._udp.rl.example.internal
  resolver: 10.96.0.10
  resolver_timeout: 500ms
  credentials: creds.yaml
  request_policy: single_round
  fail: close
  bind: 10.0.0.5
  debug: true
` + ptService
	p, err := Load(ptWrite(t, policy, creds))
	if err != nil {
		t.Fatal(err)
	}
	rl := p.RateLimitly
	if rl.SRV != "_ratelimitly._udp.rl.example.internal" || rl.Resolver != "10.96.0.10:53" || rl.ResolverTimeout != 500*time.Millisecond ||
		rl.Credential.KeyID != 9 || rl.Fail != FailClose || rl.Bind != netip.MustParseAddr("10.0.0.5") || !rl.Debug ||
		rl.RequestPolicy.Name != PolicySingleRound || rl.Horizon != 20*time.Millisecond || rl.GeneratedCredential {
		t.Fatalf("ratelimitly %+v", rl)
	}
	// srv mode: the client uses exactly one key.
	two := "credentials:\n- {tenant: a, key_id: 1, secret: " + ptSecret + "}\n- {tenant: a, key_id: 2, secret: " + ptSecret + "}\n"
	if _, err := Load(ptWrite(t, policy, two)); err == nil || !strings.Contains(err.Error(), "has 2 keys; a client uses exactly one") {
		t.Fatalf("two keys in srv mode: %v", err)
	}
	// embedded mode: the server accepts all, the client uses the first.
	p, err = Load(ptWrite(t, "ratelimitly: {embedded: true, credentials: creds.yaml}\n"+ptService, two))
	if err != nil || len(p.RateLimitly.Credentials) != 2 || p.RateLimitly.Credential.KeyID != 1 {
		t.Fatalf("embedded with two keys: %v", err)
	}
}

func TestEmbeddedGeneratesKey(t *testing.T) {
	a := ptLoad(t, ptEmbedded+ptService).RateLimitly
	b := ptLoad(t, ptEmbedded+ptService).RateLimitly
	if !a.GeneratedCredential || a.Credential.Secret == ([32]byte{}) || a.Credential.Secret == b.Credential.Secret {
		t.Fatal("embedded without credentials must generate a fresh random key")
	}
	if len(a.Credentials) != 1 || a.Credentials[0].Secret != a.Credential.Secret {
		t.Fatal("generated key not offered to the embedded server")
	}
}

func TestRequestPolicyHorizon(t *testing.T) {
	ms := time.Millisecond
	cases := []struct {
		p    RequestPolicy
		want time.Duration
	}{
		{ratelimitly.Standard(20 * ms), 60 * ms},
		{ratelimitly.Standard(7 * ms), 21 * ms},
		{ratelimitly.SingleRound(20 * ms), 20 * ms},
		{RequestPolicy{Name: PolicyCustom, Unit: 10 * ms}, 10 * ms},
		{RequestPolicy{Name: PolicyCustom, Unit: 10 * ms, Replays: 3, ReplayGaps: []time.Duration{5 * ms, 7 * ms}, FinalReceive: 4 * ms}, (10 + 5 + 7 + 7 + 4) * ms},
		{RequestPolicy{Name: PolicyCustom, Unit: 10 * ms, Replays: 2, ReplayGaps: []time.Duration{5 * ms, 7 * ms}}, (10 + 5 + 7) * ms},
		{RequestPolicy{Name: PolicyCustom, Unit: 10 * ms, Replays: 2}, (10 + 10 + 10) * ms}, // no gaps: each replay waits a unit
	}
	for _, tc := range cases {
		if got := tc.p.Horizon(); got != tc.want {
			t.Errorf("%+v: horizon %v, want %v", tc.p, got, tc.want)
		}
	}
	// The loader fills the fields from the file and validates the result.
	p := ptLoad(t, "ratelimitly:\n  embedded: true\n  request_policy: {name: custom, unit: 10ms, replays: 3, replay_gaps: [5ms, 7ms], final_receive: 4ms, completion: true}\n"+ptService)
	rp := p.RateLimitly.RequestPolicy
	if rp.Name != PolicyCustom || rp.Replays != 3 || len(rp.ReplayGaps) != 2 || !rp.Completion || p.RateLimitly.Horizon != 33*ms {
		t.Fatalf("custom policy %+v horizon %v", rp, p.RateLimitly.Horizon)
	}
	// Unset completion on custom stays false.
	p = ptLoad(t, "ratelimitly:\n  embedded: true\n  request_policy: {name: custom, unit: 10ms}\n"+ptService)
	if p.RateLimitly.RequestPolicy.Completion {
		t.Fatal("custom completion defaulted to true")
	}
	// Exactly at the wire limit is accepted; one ms more is not.
	ptLoad(t, "ratelimitly:\n  embedded: true\n  request_policy: {name: single_round, unit: 65535ms}\n"+ptService)
	if _, err := Load(ptWrite(t, "ratelimitly:\n  embedded: true\n  request_policy: {name: custom, unit: 65535ms, final_receive: 1ms}\n"+ptService, "")); err == nil {
		t.Fatal("horizon 65536ms accepted")
	}
	// Exactly max_horizon is accepted.
	creds := "tenant: t\nkey_id: 1\nsecret: " + ptSecret + "\nmax_horizon: 60ms\n"
	if _, err := Load(ptWrite(t, "ratelimitly: {embedded: true, credentials: creds.yaml}\n"+ptService, creds)); err != nil {
		t.Fatalf("standard 60ms with max_horizon 60ms: %v", err)
	}
}

// One mistake gives one error, not a cascade of follow-up errors.
func TestLoadOneErrorPerMistake(t *testing.T) {
	for name, src := range map[string]string{
		"srv wrong type":      "ratelimitly: {srv: 5}\n" + ptService,
		"embedded wrong type": "ratelimitly: {embedded: \"yes\"}\n" + ptService,
		"bad zone rate":       ptEmbedded + "zones:\n  z: {bucket: x, rate: fast}\n" + ptService + "    limit: [z]\n",
		"bad guard threshold": ptEmbedded + "trackers:\n  t: {service: s}\n" + ptService + "    guard: [{tracker: t, threshold: soon}]\n",
		"bad label":           ptEmbedded + ptService + "    label: \"{nope}\"\n",
		"bad service port":    ptEmbedded + "services:\n  - {name: a, port: x, upstream: 127.0.0.1:1}\n",
	} {
		_, err := Load(ptWrite(t, src, ""))
		var le *LoadError
		if !errors.As(err, &le) || len(le.Errs) != 1 {
			t.Errorf("%s: want exactly one error, got %v", name, err)
		}
	}
}

// A bad reference inherited by several locations is reported once.
func TestLoadInheritedRefReportedOnce(t *testing.T) {
	src := ptEmbedded + ptService + "    limit: [nope]\n    locations:\n      - {match: {path: /a}}\n      - {match: {path: /b}}\n      - {match: {path: /c}}\n"
	_, err := Load(ptWrite(t, src, ""))
	var le *LoadError
	if !errors.As(err, &le) || len(le.Errs) != 1 || le.Errs[0].Line != 6 || !strings.Contains(le.Errs[0].Msg, `unknown zone "nope" (inherited)`) {
		t.Fatalf("want one error at line 6, got %v", err)
	}
}
