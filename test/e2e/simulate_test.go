package e2e

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// The proxy's own access log, recorded under a lax policy (burst 100),
// replayed by `rl-tproxy simulate` against a burst-3 policy: 20 requests
// of 2 users give 14 would-deny in location api, 7 per user, and the
// difference from the log (all 20 were admitted).
func TestSimulateRecordedLog(t *testing.T) {
	e := newEnv(t, nil, policyOpts{burst: 100})
	for i := range 20 {
		user := []string{"alice", "bob"}[i%2]
		if r := e.get(t, "/api/items?user="+user, "X-Key: "+user); r.status != 200 {
			t.Fatalf("request %d: %d under the lax policy", i, r.status)
		}
	}
	e.p.waitAccess(20)
	e.p.mu.Lock()
	logText := strings.Join(e.p.raw, "\n") + "\n" // every line the proxy wrote, not only access lines
	e.p.mu.Unlock()
	logPath := filepath.Join(e.dir, "access.log")
	newPolicy := filepath.Join(e.dir, "burst3.yaml")
	if err := os.WriteFile(logPath, []byte(logText), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(newPolicy, []byte(`ratelimitly:
  srv: _ratelimitly._udp.prod.example.internal
  credentials: /etc/rl-tproxy/credentials.yaml
zones:
  per_user: {bucket: "u:{query.user}", rate: 5/m, burst: 3}
services:
  - name: web
    listen: 127.0.0.1:8080
    upstream: 127.0.0.1:8081
    locations:
      - name: api
        match: {path_prefix: /}
        limit: [per_user]
`), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(binPath, "simulate", "--policy", newPolicy, "--access-log", logPath, "--output", "json").Output()
	if err != nil {
		t.Fatalf("simulate: %v\n%s", err, out)
	}
	var res struct {
		Replayed  int64 `json:"replayed"`
		Malformed int64 `json:"malformed"`
		Locations []struct {
			Service, Location    string
			Requests             int64 `json:"requests"`
			WouldDeny            int64 `json:"would_deny"`
			DenyRecordedAdmitted int64 `json:"deny_recorded_admitted"`
			Zones                []struct {
				Zone    string `json:"zone"`
				TopKeys []struct {
					Key    string `json:"key"`
					Denies uint64 `json:"denies"`
				} `json:"top_keys"`
			} `json:"zones"`
		} `json:"locations"`
	}
	if err := json.Unmarshal(out, &res); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if res.Replayed != 20 || res.Malformed != 0 || len(res.Locations) != 1 {
		t.Fatalf("%s", out)
	}
	l := res.Locations[0]
	if l.Location != "api" || l.Requests != 20 || l.WouldDeny != 14 || l.DenyRecordedAdmitted != 14 {
		t.Fatalf("location %+v", l)
	}
	keys := l.Zones[0].TopKeys
	if len(keys) != 2 || keys[0].Denies != 7 || keys[1].Denies != 7 || keys[0].Key != "u:alice" || keys[1].Key != "u:bob" {
		t.Fatalf("keys %+v", keys)
	}
}
