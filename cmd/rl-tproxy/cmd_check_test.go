package main

import (
	"bytes"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

func TestCheckExamplePolicy(t *testing.T) {
	var out, errb bytes.Buffer
	code := dispatch([]string{"check", "--policy", "../../examples/policy.yaml"}, &out, &errb)
	if code != exitOK {
		t.Fatalf("exit %d, stderr:\n%s", code, errb.String())
	}
	if s := out.String(); strings.Count(s, "\n") != 1 || !strings.Contains(s, "ok: 1 service, 4 locations") {
		t.Fatalf("summary %q", s)
	}
}

func TestCheckMissingPolicyFlag(t *testing.T) {
	var out, errb bytes.Buffer
	if code := dispatch([]string{"check"}, &out, &errb); code != exitInvalid || !strings.Contains(errb.String(), "--policy FILE is required") {
		t.Fatalf("exit %d, stderr %q", code, errb.String())
	}
	if code := dispatch([]string{"check", "--policy", filepath.Join(t.TempDir(), "nope.yaml")}, &out, &errb); code != exitInvalid {
		t.Fatalf("missing file: exit %d", code)
	}
}

// The must-show cases: each fails check with exit 1 and a
// FILE:LINE: error on stderr.
func TestCheckInvalidPolicies(t *testing.T) {
	const svc = "services:\n  - name: web\n    listen: 127.0.0.1:8080\n    upstream: 127.0.0.1:8081\n"
	creds := "tenant: t\nkey_id: 1\nsecret: AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=\nmax_horizon: 100ms\n"
	cases := []struct {
		name, policy, want string
	}{
		{"unknown key", "ratelimitly: {embedded: true}\n" + svc + "    colour: blue\n", `:6: services[0] (web): unknown key "colour"`},
		{"bad rate", "ratelimitly: {embedded: true}\nzones:\n  z: {bucket: x, rate: 5/week}\n" + svc, `:3: zones.z.rate: bad rate "5/week"`},
		{"unknown template variable", "ratelimitly: {embedded: true}\nzones:\n  z: {bucket: \"{client_ip}\", rate: 5/s}\n" + svc, ":3: zones.z.bucket: offset 0: unknown variable {client_ip}"},
		{"2000-byte static bucket", "ratelimitly: {embedded: true}\nzones:\n  z: {rate: 5/s, bucket: " + strings.Repeat("b", 2000) + "}\n" + svc, ":3: zones.z.bucket: static value is 2000 bytes, over the 1024-byte limit"},
		{"300-byte label", "ratelimitly: {embedded: true}\n" + svc + "    label: " + strings.Repeat("l", 300) + "\n", ":6: services[0] (web).label: static value is 300 bytes, over the 256-byte limit"},
		{"admission timeout at the horizon", "ratelimitly: {embedded: true}\n" + svc + "    timeouts: {admission: 60ms}\n", ":6: services[0] (web).timeouts.admission: 60ms must exceed the request policy's horizon 60ms (ratelimitly.request_policy standard)"},
		{"admission timeout absurd", "ratelimitly: {embedded: true}\ndefaults:\n  timeouts: {admission: 2h}\n" + svc, ":3: defaults.timeouts.admission: duration 2h0m0s out of range 1ms..10m0s"},
		{"custom horizon over max_horizon", "ratelimitly:\n  embedded: true\n  credentials: creds.yaml\n  request_policy: {name: custom, unit: 50ms, replays: 1, replay_gaps: [50ms], final_receive: 50ms}\n" + svc, ":4: ratelimitly.request_policy: request policy custom: horizon 150ms exceeds the credential's max_horizon 100ms (credential key_id 1 in "},
	}
	located := regexp.MustCompile(`^\S+\.yaml:[0-9]+: \S`)
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			if err := os.WriteFile(filepath.Join(dir, "creds.yaml"), []byte(creds), 0o600); err != nil {
				t.Fatal(err)
			}
			path := filepath.Join(dir, "policy.yaml")
			if err := os.WriteFile(path, []byte(tc.policy), 0o600); err != nil {
				t.Fatal(err)
			}
			var out, errb bytes.Buffer
			code := dispatch([]string{"check", "--policy", path}, &out, &errb)
			if code != exitInvalid {
				t.Fatalf("exit %d, want %d; stdout %q", code, exitInvalid, out.String())
			}
			if out.Len() != 0 {
				t.Errorf("stdout not empty: %q", out.String())
			}
			lines := strings.Split(strings.TrimSpace(errb.String()), "\n")
			if !strings.Contains(errb.String(), path+tc.want) {
				t.Errorf("stderr lacks %q:\n%s", path+tc.want, errb.String())
			}
			for _, l := range lines[:len(lines)-1] { // the last line is the count
				if !located.MatchString(l) {
					t.Errorf("stderr line %q is not FILE:LINE: message", l)
				}
			}
		})
	}
}

// check warns when fail: open meets a bucket rendered from a value the
// client controls without invalid: deny; the policy is still valid.
func TestCheckWarnsClientValueUnderFailOpen(t *testing.T) {
	const policy = "ratelimitly:\n  embedded: true\n  fail: open\n%szones:\n  tk: {bucket: \"tk:{header.x-key}\", rate: 1/m}\n" +
		"services:\n  - name: web\n    listen: 127.0.0.1:8080\n    upstream: 127.0.0.1:8081\n    limit: [tk]\n"
	for _, tc := range []struct{ knob, want string }{
		{"", ":5: warning: zones.tk.bucket renders {header.x-key}, which the client controls: under fail: open"},
		{"  invalid: deny\n", ""},
	} {
		path := filepath.Join(t.TempDir(), "policy.yaml")
		if err := os.WriteFile(path, []byte(strings.Replace(policy, "%s", tc.knob, 1)), 0o600); err != nil {
			t.Fatal(err)
		}
		var out, errb bytes.Buffer
		if code := dispatch([]string{"check", "--policy", path}, &out, &errb); code != exitOK {
			t.Fatalf("exit %d, stderr %q", code, errb.String())
		}
		if tc.want == "" && errb.Len() != 0 || tc.want != "" && !strings.Contains(errb.String(), path+tc.want) {
			t.Fatalf("knob %q: stderr %q, want %q", tc.knob, errb.String(), tc.want)
		}
	}
}

// TestRunBadFlagValues: run refuses flag values it cannot use with exit 1
// and the flag's name, before it loads the policy (the file need not
// exist).
func TestRunBadFlagValues(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "nope.yaml")
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--loop-kernel-wait", "sometimes"}, `--loop-kernel-wait: loop kernel wait "sometimes": want off or light`},
		{[]string{"--loop-kernel-wait", "always"}, `--loop-kernel-wait: loop kernel wait "always": want off or light (always measured no better than light and was removed)`},
		{[]string{"--loop-kernel-wait="}, "--loop-kernel-wait: "},
		{[]string{"--loop-backend", "kqueue"}, `--loop-backend: loop backend "kqueue": want auto, io_uring or epoll`},
		{[]string{"--loop-backend="}, "--loop-backend: "},
		{[]string{"--event-loops", "-1"}, "--event-loops -1: want 0 or more"},
		{[]string{"--log-buffer", "100"}, "--log-buffer 100: want at least 4096"},
		{[]string{"--log-buffer", "-1"}, "--log-buffer -1: want at least 4096"},
		{[]string{"--splice-min", "-5"}, "--splice-min -5: want 0 (never) or more"},
		{[]string{"--splice-min", "1e6"}, `invalid value "1e6" for flag -splice-min`},
		{[]string{"--upstream-dns-refresh", "0"}, "--upstream-dns-refresh 0s: want at least 100ms"},
		{[]string{"--upstream-dns-refresh", "-1s"}, "--upstream-dns-refresh -1s: want at least 100ms"},
		{[]string{"--upstream-dns-refresh", "5"}, `invalid value "5" for flag -upstream-dns-refresh`},
	} {
		var out, errb bytes.Buffer
		args := append([]string{"run", "--policy", missing}, tc.args...)
		if code := dispatch(args, &out, &errb); code != exitInvalid || !strings.Contains(errb.String(), tc.want) {
			t.Errorf("%v: exit %d, stderr %q; want %d and %q", tc.args, code, errb.String(), exitInvalid, tc.want)
		}
	}
}
