package e2e

import (
	"bytes"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/rl-tproxy/rl-tproxy/internal/testkit"
)

// Shadow mode obtains the decision, logs and counts "would deny", and
// admits; the servers still see the checks, and admitted work reports.
func TestShadowMode(t *testing.T) {
	e := newEnv(t, nil, policyOpts{})
	before := e.c.Requests()
	for i := 0; i < 6; i++ {
		if r := e.get(t, "/shadow/x", "X-Key: shadowed"); r.status != 200 {
			t.Fatalf("shadow request %d: %d", i, r.status)
		}
	}
	if got := e.c.Requests() - before; got != 6*3 {
		t.Errorf("servers decided %d requests, want 18 (6 checks fanned out to 3)", got)
	}
	lines := e.p.access()
	testkit.WaitFor(t, "6 access lines", func() bool { lines = e.p.access(); return len(lines) >= 6 })
	outcomes := map[string]int{}
	for _, l := range lines {
		outcomes[fmt.Sprint(l["outcome"])]++
		if l["outcome"] == "shadow_deny" && (l["verdict"] != "deny" || l["cause"] != "deny_resource" || l["report"] != true) {
			t.Errorf("shadow deny line %v", l)
		}
	}
	if outcomes["allow"] != 3 || outcomes["shadow_deny"] != 3 {
		t.Fatalf("outcomes %v, want 3 allow and 3 shadow_deny", outcomes)
	}
	if v := e.p.metric(`rl_tproxy_requests_total{location="shadow",outcome="shadow_deny",service="web"}`); v != 3 {
		t.Fatalf("shadow_deny metric %v", v)
	}
	if e.up.hits.Load() != 6 {
		t.Fatalf("upstream saw %d, want 6", e.up.hits.Load())
	}
}

// Shadow requests spend the shadow namespace of their zone's buckets,
// never an enforced location's tokens: three shadow requests (the zone's
// whole burst) on /shadow, then an enforced request on the same zone and
// key is admitted; the shadow location still says "would deny" once its
// own namespace is spent.
func TestShadowSpendsNoEnforcedTokens(t *testing.T) {
	e := newEnv(t, nil, policyOpts{})
	for i := 0; i < 3; i++ {
		if r := e.get(t, "/shadow/x", "X-Key: shared"); r.status != 200 {
			t.Fatalf("shadow request %d: %d", i, r.status)
		}
	}
	if r := e.get(t, "/api/x", "X-Key: shared"); r.status != 200 {
		t.Fatalf("enforced request after 3 shadow requests on the same zone: %d, want 200", r.status)
	}
	if r := e.get(t, "/shadow/x", "X-Key: shared"); r.status != 200 {
		t.Fatalf("4th shadow request: %d", r.status)
	}
	l := e.p.waitAccess(5)
	if l["location"] != "shadow" || l["outcome"] != "shadow_deny" || l["verdict"] != "deny" || l["deny_zones"] != "strict" {
		t.Fatalf("4th shadow request's access line %v, want a would-deny on zone strict", l)
	}
	if l := e.p.waitAccess(4); l["location"] != "api" || l["outcome"] != "allow" {
		t.Fatalf("enforced request's access line %v", l)
	}
}

// A scrape of the real process passes promtool, has the documented
// families, and /healthz and /readyz answer.
func TestMetricsPromtool(t *testing.T) {
	promtool := testkit.NeedTool(t, "promtool", "prometheus")
	e := newEnv(t, nil, policyOpts{})
	e.get(t, "/api/x", "X-Key: m")
	e.get(t, "/probe")
	e.p.waitAccess(2)
	body := e.p.scrape()
	cmd := exec.Command(promtool, "check", "metrics")
	cmd.Stdin = strings.NewReader(body)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		t.Fatalf("promtool check metrics: %v\n%s", err, out.String())
	}
	for _, want := range []string{
		`rl_tproxy_requests_total{location="api",outcome="allow",service="web"} 1`,
		`rl_tproxy_requests_total{location="probe",outcome="bypass",service="web"} 1`,
		`rl_tproxy_ratelimitly_endpoints 3`,
		`rl_tproxy_ratelimitly_discovery_ready 1`,
		`rl_tproxy_policy_generation 1`,
		`rl_tproxy_admission_duration_seconds_count{location="api",service="web"} 1`,
		`rl_tproxy_latency_reports_total{service="web"} 2`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("scrape lacks %q", want)
		}
	}
	// The event loops served both requests: turns and parks counted, and
	// once curl's connections are gone no connection holds a buffer.
	if v := e.p.metric("rl_tproxy_event_loops"); v < 1 {
		t.Errorf("rl_tproxy_event_loops %v", v)
	}
	if v := e.p.metric("rl_tproxy_event_loop_turns_total"); v < 2 {
		t.Errorf("rl_tproxy_event_loop_turns_total %v for 2 requests", v)
	}
	if v := e.p.metric(`rl_tproxy_event_loop_waits_total{how="netpoller"}`); v < 1 {
		t.Errorf("no loop parked in the netpoller (%v)", v)
	}
	testkit.WaitFor(t, "no open connection and no buffer held", func() bool {
		return e.p.metric("rl_tproxy_open_connections") == 0 && e.p.metric("rl_tproxy_event_loop_buffers") == 0
	})
	if r := curl(t, "http://"+e.p.admin+"/healthz"); r.status != 200 {
		t.Errorf("/healthz %d", r.status)
	}
	if r := curl(t, "http://"+e.p.admin+"/readyz"); r.status != 200 || !strings.Contains(r.body, "ok ratelimitly") {
		t.Errorf("/readyz %d %q", r.status, r.body)
	}
}

// A proxy whose RateLimitly cannot be discovered is alive but not ready.
func TestReadyzWithoutDiscovery(t *testing.T) {
	e := newEnv(t, nil, policyOpts{srv: "_nothing._udp.e2e.test.", notReady: true})
	r := curl(t, "http://"+e.p.admin+"/readyz")
	if r.status != 503 || !strings.Contains(r.body, "fail ratelimitly") {
		t.Fatalf("/readyz %d %q", r.status, r.body)
	}
	if r := curl(t, "http://"+e.p.admin+"/healthz"); r.status != 200 {
		t.Fatalf("/healthz %d", r.status)
	}
}

// wrkScript counts responses by status in the (single) wrk thread and
// prints them at the end.
const wrkScript = `
counts = {}
function response(status, headers, body)
  counts[status] = (counts[status] or 0) + 1
end
local threads = {}
function setup(thread) table.insert(threads, thread) end
function done(summary, latency, requests)
  for _, th in ipairs(threads) do
    local c = th:get("counts")
    for status, n in pairs(c) do io.write(string.format("STATUS %d %d\n", status, n)) end
  end
  local e = summary.errors
  io.write(string.format("ERRORS %d %d %d %d %d\n", e.connect, e.read, e.write, e.status, e.timeout))
end
`

// A reload under wrk load: zero responses other than 200 and 429, no
// socket errors, and the new limit in force afterwards.
func TestReloadUnderLoad(t *testing.T) {
	wrk := testkit.NeedTool(t, "wrk", "wrk")
	e := newEnv(t, nil, policyOpts{rate: "100/s", burst: 50})
	script := filepath.Join(e.dir, "count.lua")
	if err := os.WriteFile(script, []byte(wrkScript), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(wrk, "-t1", "-c4", "-d3s", "--timeout", "10s", "-s", script, "-H", "X-Key: loaded", e.p.base+"/api/load")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	// Reload twice while wrk runs: by file change (rate 7/m) then SIGHUP
	// after another change (rate 9/m, burst 2).
	testkit.WaitFor(t, "load reaching the proxy", func() bool { return len(e.p.access()) >= 50 })
	o := e.opts
	o.rate, o.burst = "7/m", 5
	writePolicy(t, e.dir, e.c, o)
	testkit.WaitFor(t, "file-triggered reload", func() bool {
		return e.p.metric(`rl_tproxy_policy_generation`) == 2
	})
	o.rate, o.burst = "9/m", 2
	writePolicy(t, e.dir, e.c, o)
	e.p.signal(syscall.SIGHUP)
	testkit.WaitFor(t, "reload to generation 3", func() bool { return e.p.metric(`rl_tproxy_policy_generation`) == 3 })
	if err := cmd.Wait(); err != nil {
		t.Fatalf("wrk: %v\n%s", err, out.String())
	}
	counts := map[int]int{}
	for _, m := range regexp.MustCompile(`STATUS (\d+) (\d+)`).FindAllStringSubmatch(out.String(), -1) {
		s, _ := strconv.Atoi(m[1])
		n, _ := strconv.Atoi(m[2])
		counts[s] += n
	}
	if counts[200] == 0 || counts[429] == 0 {
		t.Fatalf("wrk statuses %v (want both 200 and 429)\n%s", counts, out.String())
	}
	for s, n := range counts {
		if s != 200 && s != 429 {
			t.Errorf("%d responses with status %d during reload", n, s)
		}
	}
	if m := regexp.MustCompile(`ERRORS (\d+) (\d+) (\d+) (\d+) (\d+)`).FindStringSubmatch(out.String()); m == nil || m[1] != "0" || m[2] != "0" || m[3] != "0" || m[5] != "0" { // connect, read, write, timeout (status = non-2xx, the 429s)
		t.Errorf("wrk socket errors: %v\n%s", m, out.String())
	}
	// The new limit is in force: a fresh key gets burst 2 and the 9/m policy.
	for i := 0; i < 2; i++ {
		if r := e.get(t, "/api/after", "X-Key: after-reload"); r.status != 200 {
			t.Fatalf("after reload %d: %d", i, r.status)
		}
	}
	r := e.get(t, "/api/after", "X-Key: after-reload")
	if r.status != 429 || r.header.Get("RateLimit-Policy") != `"strict";q=9;w=60` {
		t.Fatalf("after reload: %d %q", r.status, r.header.Get("RateLimit-Policy"))
	}
	// The second change races the watcher and SIGHUP: whichever comes
	// first applies it, the other finds it unchanged.
	sig := e.p.metric(`rl_tproxy_policy_reloads_total{result="success",trigger="signal"}`)
	file := e.p.metric(`rl_tproxy_policy_reloads_total{result="success",trigger="file"}`)
	if file < 1 || sig+file != 2 {
		t.Errorf("successful reloads: signal %v file %v, want 2 with at least 1 by file", sig, file)
	}
	t.Logf("wrk statuses %v", counts)
}

// Rotating the credentials file under load rebuilds the RateLimitly
// client without dropping a request: every response is 200 or 429, every
// request got a valid decision (no fail_* outcome), and requests after the
// rotation are decided with the new key.
func TestCredentialRotationUnderLoad(t *testing.T) {
	wrk := testkit.NeedTool(t, "wrk", "wrk")
	e := newEnv(t, nil, policyOpts{rate: "100/s", burst: 50})
	script := filepath.Join(e.dir, "count.lua")
	if err := os.WriteFile(script, []byte(wrkScript), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(wrk, "-t1", "-c4", "-d3s", "--timeout", "10s", "-s", script, "-H", "X-Key: rot", e.p.base+"/api/load")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	testkit.WaitFor(t, "load reaching the proxy", func() bool { return len(e.p.access()) >= 50 })
	writeCredentials(t, e.dir, e.c.cred2) // the watcher sees the credentials file change
	testkit.WaitFor(t, "client rebuilt", func() bool { return e.p.metric(`rl_tproxy_ratelimitly_client_rebuilds_total`) == 1 })
	if err := cmd.Wait(); err != nil {
		t.Fatalf("wrk: %v\n%s", err, out.String())
	}
	for _, m := range regexp.MustCompile(`STATUS (\d+) (\d+)`).FindAllStringSubmatch(out.String(), -1) {
		if m[1] != "200" && m[1] != "429" {
			t.Errorf("%s responses with status %s during the rotation", m[2], m[1])
		}
	}
	if m := regexp.MustCompile(`ERRORS (\d+) (\d+) (\d+) (\d+) (\d+)`).FindStringSubmatch(out.String()); m == nil || m[1] != "0" || m[2] != "0" || m[3] != "0" || m[5] != "0" {
		t.Errorf("wrk socket errors: %v\n%s", m, out.String())
	}
	outcomes := map[string]int{}
	for _, l := range e.p.access() {
		outcomes[fmt.Sprint(l["outcome"])]++
	}
	for o, n := range outcomes {
		// client_abort: wrk closes its connections mid-request when it stops.
		if o != "allow" && o != "deny" && o != "client_abort" {
			t.Errorf("%d requests without a valid decision (%s) during the rotation", n, o)
		}
	}
	// Decisions keep coming from the rebuilt client.
	if r := e.get(t, "/api/after", "X-Key: after-rotation"); r.status != 200 {
		t.Fatalf("after rotation: %d", r.status)
	}
	t.Logf("outcomes %v", outcomes)
}

// With the watch off, only SIGHUP reloads.
func TestSighupReload(t *testing.T) {
	e := newEnv(t, nil, policyOpts{args: []string{"--watch=false"}})
	o := e.opts
	o.rate, o.burst = "11/m", 1
	writePolicy(t, e.dir, e.c, o)
	if r := e.get(t, "/api/x", "X-Key: s"); r.status != 200 {
		t.Fatalf("status %d", r.status)
	}
	if v := e.p.metric(`rl_tproxy_policy_generation`); v != 1 {
		t.Fatalf("generation %v without a signal (watch off)", v)
	}
	e.p.signal(syscall.SIGHUP)
	testkit.WaitFor(t, "SIGHUP reload", func() bool { return e.p.metric(`rl_tproxy_policy_generation`) == 2 })
	if v := e.p.metric(`rl_tproxy_policy_reloads_total{result="success",trigger="signal"}`); v != 1 {
		t.Fatalf("signal reloads %v", v)
	}
	if r := e.get(t, "/api/y", "X-Key: s2"); r.status != 200 {
		t.Fatalf("first request after reload: %d", r.status)
	}
	r := e.get(t, "/api/y", "X-Key: s2")
	if r.status != 429 || r.header.Get("RateLimit-Policy") != `"strict";q=11;w=60` {
		t.Fatalf("new limit not in force: %d %q", r.status, r.header.Get("RateLimit-Policy"))
	}
}

// An invalid reload is rejected with FILE:LINE errors and counted; the old
// policy keeps serving.
func TestInvalidReloadKeepsServing(t *testing.T) {
	e := newEnv(t, nil, policyOpts{})
	if r := e.get(t, "/api/x", "X-Key: v"); r.status != 200 {
		t.Fatalf("before: %d", r.status)
	}
	bad := strings.Replace(mustRead(t, e.p.policy), "limit: [strict]\n        report: slow\n", "limit: [nope]\n        bogus: 1\n", 1)
	if err := os.WriteFile(e.p.policy, []byte(bad), 0o644); err != nil {
		t.Fatal(err)
	}
	e.p.signal(syscall.SIGHUP)
	testkit.WaitFor(t, "reload errors counted", func() bool {
		return e.p.metric(`rl_tproxy_policy_reloads_total{result="error",trigger="signal"}`) >= 1
	})
	if v := e.p.metric(`rl_tproxy_policy_reload_errors_total`); v < 2 {
		t.Errorf("reload errors %v, want >= 2 (unknown zone, unknown key)", v)
	}
	if v := e.p.metric(`rl_tproxy_policy_generation`); v != 1 {
		t.Errorf("generation %v after a rejected reload", v)
	}
	found := 0
	for _, l := range e.p.snapshot() {
		if l["msg"] == "policy reload rejected" && strings.HasPrefix(fmt.Sprint(l["error"]), e.p.policy+":") {
			found++
		}
	}
	if found < 2 {
		t.Errorf("%d FILE:LINE errors logged, want >= 2", found)
	}
	for i := 0; i < 2; i++ {
		if r := e.get(t, "/api/x", "X-Key: v"); r.status != 200 {
			t.Fatalf("old policy stopped serving: %d", r.status)
		}
	}
	if r := e.get(t, "/api/x", "X-Key: v"); r.status != 429 {
		t.Fatalf("old limit (burst 3) not in force: %d", r.status)
	}
}

func mustRead(t *testing.T, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// SIGTERM drains and exits 0; an invalid policy exits 1.
func TestExitCodes(t *testing.T) {
	e := newEnv(t, nil, policyOpts{})
	e.p.signal(syscall.SIGTERM)
	<-e.p.exited
	if e.p.exitCode != 0 {
		t.Fatalf("exit %d after SIGTERM", e.p.exitCode)
	}
	bad := filepath.Join(t.TempDir(), "bad.yaml")
	if err := os.WriteFile(bad, []byte("ratelimitly: {embedded: true}\nnope: 1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(binPath, "run", "--policy", bad)
	out, err := cmd.CombinedOutput()
	if cmd.ProcessState.ExitCode() != 1 || !strings.Contains(string(out), bad+":") {
		t.Fatalf("invalid policy: exit %d err %v\n%s", cmd.ProcessState.ExitCode(), err, out)
	}
}

// `rl-tproxy demo --no-wait` runs its scripted part and exits 0 (on a copy
// of the example policy moved to free ports).
func TestDemoNoWait(t *testing.T) {
	dir := t.TempDir()
	src := mustRead(t, filepath.Join(repoRoot, "examples", "policy.yaml"))
	src = strings.ReplaceAll(src, "127.0.0.1:8080", freeAddr(t))
	src = strings.ReplaceAll(src, "127.0.0.1:8081", freeAddr(t))
	// A longer decision horizon for loaded CI machines (the demo key's
	// max_horizon is 200ms: 3 x 60ms fits).
	src = strings.ReplaceAll(src, "unit: 20ms", "unit: 60ms")
	if err := os.WriteFile(filepath.Join(dir, "policy.yaml"), []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	creds := mustRead(t, filepath.Join(repoRoot, "examples", "credentials.yaml"))
	if err := os.WriteFile(filepath.Join(dir, "credentials.yaml"), []byte(creds), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(binPath, "demo", "--no-wait", "--policy", filepath.Join(dir, "policy.yaml"))
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("demo: %v\n%s", err, out)
	}
	for _, want := range []string{"denied (429):", "Retry-After:", "RateLimit-Policy:", "guard tripped", "policy generation 2", "Scripted part done"} {
		if !bytes.Contains(out, []byte(want)) {
			t.Errorf("demo output lacks %q", want)
		}
	}
	// Both bursts (before and after the reload) must reach their limit:
	// some requests allowed, then denies. A demo that picked a zone it
	// cannot exercise (a tiered rate, a client header it does not send)
	// showed "allowed 10, denied 0" and then "allowed 0, denied 13".
	bursts := regexp.MustCompile(`allowed \(200\): (\d+)\s+denied \(429\): (\d+)`).FindAllSubmatch(out, -1)
	if len(bursts) != 2 {
		t.Errorf("demo output has %d burst results, want 2", len(bursts))
	}
	for i, m := range bursts {
		if string(m[1]) == "0" || string(m[2]) == "0" {
			t.Errorf("burst %d: allowed %s denied %s, want both above 0", i+1, m[1], m[2])
		}
	}
	if bytes.Contains(out, []byte(`RateLimit-Policy: `+"\n")) {
		t.Error("a deny without a RateLimit-Policy value")
	}
	if bytes.Contains(out, []byte("policy warning")) {
		t.Error("the example policy draws warnings")
	}
	if t.Failed() {
		t.Logf("demo output:\n%s", out)
	}
}

// A reload that moves the listen address opens the new one and closes the
// old one; a reload whose new address cannot be opened is rejected as a
// whole and the old address keeps serving.
func TestReloadMovesListener(t *testing.T) {
	e := newEnv(t, nil, policyOpts{})
	oldBase := e.p.base
	o := e.opts
	o.listen = freeAddr(t)
	writePolicy(t, e.dir, e.c, o)
	e.p.signal(syscall.SIGHUP)
	testkit.WaitFor(t, "reload", func() bool { return e.p.metric(`rl_tproxy_policy_generation`) == 2 })
	if r := curl(t, "http://"+o.listen+"/api/x", "-H", "X-Key: moved"); r.status != 200 {
		t.Fatalf("new address: %d", r.status)
	}
	if out, err := exec.Command("curl", "-s", "-o", "/dev/null", "--max-time", "5", oldBase+"/api/x").CombinedOutput(); err == nil {
		t.Fatalf("old address still serves: %s", out)
	}
	// Occupy an address, then ask for it: the reload is rejected.
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	o2 := o
	o2.listen = busy.Addr().String()
	o2.rate = "1/m"
	writePolicy(t, e.dir, e.c, o2)
	e.p.signal(syscall.SIGHUP)
	testkit.WaitFor(t, "rejected reload", func() bool {
		return e.p.metric(`rl_tproxy_policy_reloads_total{result="error",trigger="signal"}`) == 1
	})
	if v := e.p.metric(`rl_tproxy_policy_generation`); v != 2 {
		t.Fatalf("generation %v after a rejected reload", v)
	}
	if r := curl(t, "http://"+o.listen+"/api/x", "-H", "X-Key: moved"); r.status != 200 || r.header.Get("RateLimit-Policy") != "" {
		t.Fatalf("after the rejected reload: %d", r.status)
	}
}
