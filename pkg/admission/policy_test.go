package admission

import (
	"net/netip"
	"testing"
	"time"
)

// Inheritance: location, then service, then top-level defaults, then the
// built-in default; an unset flag never becomes true, an explicit false
// beats an inherited true, and an explicit empty list or label clears.
func TestInheritance(t *testing.T) {
	src := `ratelimitly: {embedded: true}
defaults:
  forwarded_headers: {x_forwarded_for: true, forwarded: true}
  timeouts: {header: 5s}
  limits: {max_headers: 50, max_body_bytes: 1MiB}
  ratelimit_headers: false
  limit: [z1]
  label: "def"
  mode: shadow
  deny: {status: 503, format: text}
zones:
  z1: {bucket: "a:{remote_addr}", rate: 1/s}
  z2: {bucket: "b:{remote_addr}", rate: 2/m}
trackers:
  t1: {service: "svc"}
services:
  - name: inherits
    listen: 127.0.0.1:1001
    upstream: 127.0.0.1:2001
    locations:
      - name: plain
  - name: overrides
    listen: 127.0.0.1:1002
    upstream: 127.0.0.1:2002
    forwarded_headers: {x_forwarded_for: false, x_real_ip: true}
    timeouts: {idle: 7s}
    ratelimit_headers: true
    steer_loopback: false
    limit: [z2]
    guard: [{tracker: t1, threshold: 100ms}]
    report: t1
    mode: enforce
    deny: {status: 429}
    locations:
      - name: from-service
      - name: own
        limit: [z1, z2]
        label: "own:{method}"
        mode: shadow
        deny: {format: json, status: 418}
      - name: cleared
        limit: []
        guard: []
        label: ""
        report: ""
  - name: no-defaults-flags
    port: 80
    upstream: 127.0.0.1:80
`
	p := ptLoad(t, src)
	svc := map[string]*Service{}
	loc := map[string]*Location{}
	for _, s := range p.Services {
		svc[s.Name] = s
		for _, l := range s.Locations {
			loc[s.Name+"/"+l.Name] = l
		}
	}

	// Service level.
	in := svc["inherits"]
	if in.Forward != (ForwardHeaders{XForwardedFor: true, Forwarded: true}) {
		t.Errorf("inherits forward %+v", in.Forward)
	}
	if in.Timeouts != (Timeouts{Header: 5 * time.Second, Idle: DefaultIdleTimeout, Upstream: DefaultUpstreamTimeout, Admission: DefaultAdmissionTimeout}) {
		t.Errorf("inherits timeouts %+v", in.Timeouts)
	}
	if in.Limits.MaxHeaders != 50 || in.Limits.MaxBodyBytes != 1<<20 || in.Limits.MaxHeaderBytes != DefaultMaxHeaderBytes || in.Limits.MaxRequestsPerConn != 0 {
		t.Errorf("inherits limits %+v", in.Limits)
	}
	if in.RateLimitHeaders != RateLimitFieldsOff || !in.SteerLoopback || in.Deny != (Deny{503, DenyText, DefaultDenyGRPCStatus, DefaultGuardRetryAfter}) {
		t.Errorf("inherits flags: ratelimit_headers %v steer_loopback %v deny %+v", in.RateLimitHeaders, in.SteerLoopback, in.Deny)
	}
	ov := svc["overrides"]
	if ov.Forward != (ForwardHeaders{Forwarded: true, XRealIP: true}) { // explicit false beats inherited true
		t.Errorf("overrides forward %+v", ov.Forward)
	}
	if ov.Timeouts.Header != 5*time.Second || ov.Timeouts.Idle != 7*time.Second {
		t.Errorf("overrides timeouts %+v", ov.Timeouts)
	}
	if ov.RateLimitHeaders != RateLimitFieldsDeny || ov.SteerLoopback || ov.Deny != (Deny{429, DenyText, DefaultDenyGRPCStatus, DefaultGuardRetryAfter}) {
		t.Errorf("overrides flags %v %v %+v", ov.RateLimitHeaders, ov.SteerLoopback, ov.Deny)
	}
	// Nothing set anywhere: built-in defaults, unset flags false.
	nd := svc["no-defaults-flags"]
	if nd.Forward != (ForwardHeaders{XForwardedFor: true, Forwarded: true}) || nd.Limits.MaxHeaders != 50 {
		t.Errorf("defaults reach every service: %+v %+v", nd.Forward, nd.Limits)
	}

	// Location level.
	check := func(key string, zones []string, guards int, label string, report string, mode Mode, deny Deny) {
		t.Helper()
		l := loc[key]
		if l == nil {
			t.Fatalf("no location %s", key)
		}
		var got []string
		for _, z := range l.Limits {
			got = append(got, z.Name)
		}
		if len(got) != len(zones) {
			t.Errorf("%s zones %v, want %v", key, got, zones)
		} else {
			for i := range got {
				if got[i] != zones[i] {
					t.Errorf("%s zones %v, want %v", key, got, zones)
				}
			}
		}
		if len(l.Guards) != guards {
			t.Errorf("%s guards %d, want %d", key, len(l.Guards), guards)
		}
		gotLabel := ""
		if l.Label != nil {
			gotLabel = l.Label.String()
		}
		if gotLabel != label {
			t.Errorf("%s label %q, want %q", key, gotLabel, label)
		}
		gotReport := ""
		if l.Report != nil {
			gotReport = l.Report.Name
		}
		if gotReport != report {
			t.Errorf("%s report %q, want %q", key, gotReport, report)
		}
		if l.Mode != mode || l.Deny != deny {
			t.Errorf("%s mode %v deny %+v, want %v %+v", key, l.Mode, l.Deny, mode, deny)
		}
	}
	check("inherits/plain", []string{"z1"}, 0, "def", "", ModeShadow, Deny{503, DenyText, DefaultDenyGRPCStatus, DefaultGuardRetryAfter})
	check("overrides/from-service", []string{"z2"}, 1, "def", "t1", ModeEnforce, Deny{429, DenyText, DefaultDenyGRPCStatus, DefaultGuardRetryAfter})
	check("overrides/own", []string{"z1", "z2"}, 1, "own:{method}", "t1", ModeShadow, Deny{418, DenyJSON, DefaultDenyGRPCStatus, DefaultGuardRetryAfter})
	check("overrides/cleared", nil, 0, "", "", ModeEnforce, Deny{429, DenyText, DefaultDenyGRPCStatus, DefaultGuardRetryAfter})
	check("no-defaults-flags/*", []string{"z1"}, 0, "def", "", ModeShadow, Deny{503, DenyText, DefaultDenyGRPCStatus, DefaultGuardRetryAfter})
	if loc["overrides/cleared"].Protected() {
		t.Error("location with limit: [] and guard: [] is protected")
	}
	if g := loc["overrides/own"].Guards[0]; g.Tracker.Name != "t1" || g.ThresholdMs != 100 {
		t.Errorf("guard %+v", g)
	}
}

// Without any defaults, flags are false, the built-ins apply, and a
// location with neither limit nor guard is unprotected (report-only ok).
func TestUnsetFlagsStayFalse(t *testing.T) {
	p := ptLoad(t, ptEmbedded+"trackers:\n  t: {service: s}\n"+ptService+"    locations:\n      - report: t\n")
	s := p.Services[0]
	if s.Forward != (ForwardHeaders{}) || p.RateLimitly.Debug || p.RateLimitly.Fail != FailOpen {
		t.Fatalf("unset flags became true: %+v debug %v", s.Forward, p.RateLimitly.Debug)
	}
	if s.Limits != (Limits{MaxRequestLine: DefaultMaxRequestLine, MaxHeaderBytes: DefaultMaxHeaderBytes, MaxHeaders: DefaultMaxHeaders}) {
		t.Fatalf("limits %+v", s.Limits)
	}
	if s.RateLimitHeaders != RateLimitFieldsDeny || !s.SteerLoopback || s.Deny != (Deny{429, DenyJSON, DefaultDenyGRPCStatus, DefaultGuardRetryAfter}) {
		t.Fatalf("documented defaults: %v %v %+v", s.RateLimitHeaders, s.SteerLoopback, s.Deny)
	}
	l := s.Locations[0]
	if l.Protected() || l.Report == nil || l.Label != nil || l.Mode != ModeEnforce {
		t.Fatalf("report-only location %+v", l)
	}
}

func TestServiceFor(t *testing.T) {
	src := ptEmbedded + `services:
  - {name: l1, listen: 127.0.0.1:8080, upstream: 127.0.0.1:9}
  - {name: l2, listen: ["0.0.0.0:8081", "[::1]:8082"], upstream: 127.0.0.1:9}
  - {name: s1, port: 80, prefixes: [10.1.0.0/16], upstream: 127.0.0.1:80}
  - {name: s2, port: 80, prefixes: [10.2.0.0/16, "fd00::/8"], upstream: 127.0.0.1:80}
  - {name: s3, port: 443, upstream: 127.0.0.1:443}
`
	p := ptLoad(t, src)
	cases := map[string]string{
		"127.0.0.1:8080":         "l1",
		"127.0.0.2:8080":         "",
		"10.9.9.9:8081":          "l2",
		"[::ffff:10.9.9.9]:8081": "l2",
		"[::1]:8082":             "l2",
		"[::2]:8082":             "",
		"10.1.2.3:80":            "s1",
		"10.2.2.3:80":            "s2",
		"[fd00::1]:80":           "s2",
		"10.3.2.3:80":            "",
		"192.0.2.1:443":          "s3",
		"192.0.2.1:444":          "",
	}
	for a, want := range cases {
		got := p.ServiceFor(netip.MustParseAddrPort(a))
		name := ""
		if got != nil {
			name = got.Name
		}
		if name != want {
			t.Errorf("ServiceFor(%s) = %q, want %q", a, name, want)
		}
	}
	if !p.Services[2].Steered() || p.Services[0].Steered() {
		t.Error("Steered()")
	}
}
