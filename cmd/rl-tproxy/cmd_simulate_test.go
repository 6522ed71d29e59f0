package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

const simPolicy = `ratelimitly:
  srv: _rl._udp.example.internal
  credentials: /nowhere/credentials.yaml
zones:
  per_client: {bucket: "c:{remote_addr}", rate: 1/m, burst: 3}
services:
  - name: web
    listen: 127.0.0.1:8080
    upstream: 127.0.0.1:8081
    locations:
      - name: api
        match: {path_prefix: /api}
        limit: [per_client]
`

// simLog is 20 admitted requests of two clients within two seconds.
func simLog() string {
	var b strings.Builder
	for i := range 20 {
		fmt.Fprintf(&b, `{"time":"2026-12-01T03:40:11.%03dZ","level":"INFO","msg":"access","service":"web","location":"api","remote":"10.0.0.%d:4000","method":"GET","host":"h","path":"/api/x","proto":"http/1.1","status":200,"verdict":"allow","outcome":"allow","cause":"allow","duration_ms":2.5}`+"\n", i*40, 1+i%2)
	}
	return b.String()
}

func TestSimulateCommand(t *testing.T) {
	dir := t.TempDir()
	pol := filepath.Join(dir, "policy.yaml")
	logf := filepath.Join(dir, "access.log")
	bad := filepath.Join(dir, "bad.yaml")
	for p, body := range map[string]string{pol: simPolicy, logf: simLog(), bad: "zones: {z: {rate: 5/week}}\n"} {
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		name string
		args []string
		code int
		out  string // in stdout (exit 0) or stderr
	}{
		{"text", []string{"--policy", pol, "--access-log", logf}, exitOK, "service web location api: 20 requests, would allow 6, would deny 14"},
		{"help", []string{"--help"}, exitOK, "Usage: rl-tproxy simulate"},
		{"no policy", []string{"--access-log", logf}, exitInvalid, "--policy FILE is required"},
		{"no log", []string{"--policy", pol}, exitInvalid, "--access-log FILE is required"},
		{"bad policy", []string{"--policy", bad, "--access-log", logf}, exitInvalid, "bad.yaml:1:"},
		{"missing policy", []string{"--policy", filepath.Join(dir, "nope.yaml"), "--access-log", logf}, exitInvalid, "nope.yaml"},
		{"bad format", []string{"--policy", pol, "--access-log", logf, "--format", "xml"}, exitInvalid, `format "xml"`},
		{"bad output", []string{"--policy", pol, "--access-log", logf, "--output", "yaml"}, exitInvalid, "--output"},
		{"huge top", []string{"--policy", pol, "--access-log", logf, "--top", "1000000000000"}, exitInvalid, "--top"},
		{"zero top", []string{"--policy", pol, "--access-log", logf, "--top", "0"}, exitInvalid, "--top 0"},
		{"stray argument", []string{"--policy", pol, "--access-log", logf, "extra"}, exitInvalid, "unexpected argument"},
		{"missing log", []string{"--policy", pol, "--access-log", filepath.Join(dir, "gone.log")}, exitRuntime, "gone.log"},
		{"log is a directory", []string{"--policy", pol, "--access-log", dir}, exitRuntime, "is a directory"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out, errb bytes.Buffer
			code := dispatch(append([]string{"simulate"}, tc.args...), &out, &errb)
			got := out.String()
			if code != exitOK {
				got = errb.String()
			}
			if code != tc.code || !strings.Contains(got, tc.out) {
				t.Fatalf("exit %d (want %d)\nstdout:\n%s\nstderr:\n%s", code, tc.code, out.String(), errb.String())
			}
		})
	}
}

func TestSimulateJSONOutput(t *testing.T) {
	dir := t.TempDir()
	pol := filepath.Join(dir, "policy.yaml")
	logf := filepath.Join(dir, "access.log")
	if os.WriteFile(pol, []byte(simPolicy), 0o644) != nil || os.WriteFile(logf, []byte(simLog()), 0o644) != nil {
		t.Fatal("cannot write the test files")
	}
	var out, errb bytes.Buffer
	if code := dispatch([]string{"simulate", "--policy", pol, "--access-log", logf, "--output", "json"}, &out, &errb); code != exitOK {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	var res struct {
		Replayed  int64
		Locations []struct {
			Location   string
			WouldDeny  int64 `json:"would_deny"`
			WouldAllow int64 `json:"would_allow"`
		}
	}
	if err := json.Unmarshal(out.Bytes(), &res); err != nil {
		t.Fatal(err)
	}
	if res.Replayed != 20 || len(res.Locations) != 1 || res.Locations[0].WouldDeny != 14 || res.Locations[0].WouldAllow != 6 {
		t.Fatalf("%s", out.String())
	}
}
