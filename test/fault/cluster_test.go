package fault

import (
	"encoding/json"
	"fmt"
	"net/http"
	"path/filepath"
	"sort"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rl-tproxy/rl-tproxy/internal/testkit"
	"github.com/rl-tproxy/rl-tproxy/internal/testkit/rlcluster"
)

// accessLine is the part of an access-log line these tests read.
type accessLine struct {
	Msg         string  `json:"msg"`
	Outcome     string  `json:"outcome"`
	Cause       string  `json:"cause"`
	Status      int     `json:"status"`
	AdmissionMs float64 `json:"admission_ms"`
}

func accessLines(p *proc) []accessLine {
	var out []accessLine
	for _, l := range p.lines() {
		var a accessLine
		if json.Unmarshal([]byte(l), &a) == nil && a.Msg == "access" {
			out = append(out, a)
		}
	}
	return out
}

// admissionStats summarises admission_ms of lines: p50, p99, max.
func admissionStats(lines []accessLine) string {
	if len(lines) == 0 {
		return "no lines"
	}
	ms := make([]float64, len(lines))
	for i, l := range lines {
		ms[i] = l.AdmissionMs
	}
	sort.Float64s(ms)
	q := func(f float64) float64 { return ms[int(f*float64(len(ms)-1))] }
	return fmt.Sprintf("n=%d admission_ms p50=%.1f p99=%.1f max=%.1f", len(ms), q(0.5), q(0.99), ms[len(ms)-1])
}

// (a) One of three RateLimitly nodes is killed (SIGKILL) under load (unit
// 250ms: generous for a shared CI machine); it stays in DNS. The killed
// node is the oldest (started first), the one the client prefers. Every
// request still gets a valid allow decision: no fail_open/fail_close, no
// timeout, before or after the kill. Once the dead node has left the usable
// set no check waits for it: over the next load the client's count of
// checks decided at a round deadline stays flat while the count decided
// early rises by exactly the number of requests. Restarted, the node
// rejoins the usable set (probe); once the two others restart too it is
// the oldest again and its answers decide (server_epoch in the access
// lines).
func TestNodeKilledUnderLoad(t *testing.T) {
	c := startCluster(t)
	up := startUpstream(t)
	dir := t.TempDir()
	creds := writeFile(t, filepath.Join(dir, "credentials.yaml"), rlcluster.CredentialYAML(c.cred))
	pol, listen := writePolicy(t, dir, c, policyOpts{fail: "close", unit: "250ms", creds: creds, upstream: up.addr})
	p := startProxy(t, pol, listen, "info", true)
	testkit.WaitWithin(t, 30*time.Second, "3 endpoints discovered", func() bool {
		return p.metric("rl_tproxy_ratelimitly_endpoints") == 3
	})

	const n, conc, killAt, m = 2000, 32, 600, 1000
	var done atomic.Bool
	res := make(chan map[int]int, 1)
	go func() { res <- load(t, p.base+"/api", n, conc, nil); done.Store(true) }()
	testkit.WaitWithin(t, 120*time.Second, fmt.Sprintf("%d requests logged before the kill", killAt), func() bool {
		return p.accN.Load() >= killAt || done.Load()
	})
	atKill := p.accN.Load()
	c.nodes[0].p.kill()
	statuses := <-res
	testkit.WaitWithin(t, 30*time.Second, "every request logged", func() bool { return p.accN.Load() >= n })
	if statuses[200] != n {
		t.Fatalf("statuses %v, want %d × 200", statuses, n)
	}
	if after := int64(n) - atKill; after < n/2 {
		t.Fatalf("only %d requests after the kill: the load ended too early to show anything", after)
	}
	testkit.WaitWithin(t, 30*time.Second, "the dead node out of the usable set", func() bool {
		return p.metric("rl_tproxy_ratelimitly_usable_endpoints") == 2
	})

	// The dead node is out: no check waits for it.
	deadline0 := p.metric(`rl_tproxy_ratelimitly_checks_decided_total{when="deadline"}`)
	early0 := p.metric(`rl_tproxy_ratelimitly_checks_decided_total{when="early"}`)
	if st := load(t, p.base+"/api", m, conc, nil); st[200] != m {
		t.Fatalf("after the node left: statuses %v, want %d × 200", st, m)
	}
	testkit.WaitWithin(t, 30*time.Second, "every request logged", func() bool { return p.accN.Load() >= n+m })
	deadline1 := p.metric(`rl_tproxy_ratelimitly_checks_decided_total{when="deadline"}`)
	early1 := p.metric(`rl_tproxy_ratelimitly_checks_decided_total{when="early"}`)
	if deadline1 != deadline0 || early1-early0 != m {
		t.Fatalf("over %d requests after the node left: decided at a deadline %v -> %v (want flat), early %v -> %v (want +%d)",
			m, deadline0, deadline1, early0, early1, m)
	}
	lines := accessLines(p.proc)
	if len(lines) != n+m {
		t.Fatalf("%d access lines, want %d", len(lines), n+m)
	}
	outcomes, causes := p.counts()
	if outcomes["allow"] != n+m || causes["allow"] != n+m {
		t.Fatalf("outcomes %v causes %v: want every one of %d requests allowed by RateLimitly", outcomes, causes, n+m)
	}
	if got := p.metric(`rl_tproxy_ratelimitly_checks_total{cause="allow"}`); got != n+m {
		t.Fatalf("client counted %v allow checks, want %d", got, n+m)
	}
	t.Logf("killed node 0 (%s) after %d of %d requests; outcomes %v", c.nodes[0].ip, atKill, n, outcomes)
	t.Logf("before the kill:             %s", admissionStats(lines[:atKill]))
	t.Logf("after the kill (same load):  %s", admissionStats(lines[atKill:n]))
	t.Logf("after the node left the set: %s (decided at a deadline: %v, early: +%v)", admissionStats(lines[n:]), deadline1-deadline0, early1-early0)

	rejoinAsOldest(t, c, p, conc)
}

// rejoinAsOldest restarts the killed node 0: the prober brings it back
// into the usable set. Then nodes 1 and 2 restart, so node 0 is the oldest
// and the client's decisions come from its answers again.
func rejoinAsOldest(t *testing.T, c *cluster, p *proxyProc, conc int) {
	c.restart(0)
	testkit.WaitWithin(t, 30*time.Second, "the restarted node back in the usable set", func() bool {
		return p.metric("rl_tproxy_ratelimitly_usable_endpoints") == 3
	})
	for i := 1; i < 3; i++ {
		c.nodes[i].p.kill()
		c.restart(i)
	}
	testkit.WaitWithin(t, 30*time.Second, "3 usable endpoints", func() bool {
		return p.metric("rl_tproxy_ratelimitly_usable_endpoints") == 3
	})
	epoch0 := c.nodes[0].epoch
	if epoch0 == 0 || epoch0 >= c.nodes[1].epoch || epoch0 >= c.nodes[2].epoch {
		t.Fatalf("epochs %d %d %d: node 0 should be the oldest", epoch0, c.nodes[1].epoch, c.nodes[2].epoch)
	}
	// A few checks learn the restarted nodes' new epochs (any valid
	// answer, late ones included, teaches it).
	if st := load(t, p.base+"/api", 50, 4, nil); st[200] != 50 {
		t.Fatalf("after the restarts: statuses %v", st)
	}
	chosen := func(i int) float64 {
		return p.metric(fmt.Sprintf(`rl_tproxy_ratelimitly_endpoint_decisions_total{addr="%s:%d",target="%s"}`,
			c.nodes[i].ip, c.nodes[i].port, rlcluster.TargetName(srvDomain, i)))
	}
	var before [3]float64
	for i := range before {
		before[i] = chosen(i)
	}
	const k = 200
	if st := load(t, p.base+"/api", k, conc, nil); st[200] != k {
		t.Fatalf("after the restarts: statuses %v", st)
	}
	if d0, d1, d2 := chosen(0)-before[0], chosen(1)-before[1], chosen(2)-before[2]; d0 != k || d1 != 0 || d2 != 0 {
		t.Fatalf("decisions by node over %d checks: %v %v %v, want all %d from node 0 (the oldest, epoch %d)", k, d0, d1, d2, k, epoch0)
	}
	t.Logf("node 0 restarted (epoch %d), then nodes 1 and 2: all %d decisions came from node 0", epoch0, k)
}

// (b) All nodes down: every request follows the failure policy. A
// fail-open proxy admits (200, outcome fail_open), a fail-close proxy
// answers 429 (outcome fail_close), both with cause timeout and an
// admission time of at least the horizon (the client waited the whole
// request policy: 3 × 100ms). When the nodes come back on the same
// addresses, admissions are allowed again.
func TestAllNodesDown(t *testing.T) {
	c := startCluster(t)
	up := startUpstream(t)
	type side struct {
		fail   string
		status int
		p      *proxyProc
	}
	sides := []*side{{fail: "open", status: 200}, {fail: "close", status: 429}}
	for _, s := range sides {
		dir := t.TempDir()
		creds := writeFile(t, filepath.Join(dir, "credentials.yaml"), rlcluster.CredentialYAML(c.cred))
		pol, listen := writePolicy(t, dir, c, policyOpts{fail: s.fail, unit: "100ms", creds: creds, upstream: up.addr})
		s.p = startProxy(t, pol, listen, "info", true)
		if st := load(t, s.p.base+"/api", 20, 4, nil); st[200] != 20 {
			t.Fatalf("fail %s: warm-up statuses %v", s.fail, st)
		}
		// Access lines trail responses: let the warm-up's all be counted.
		testkit.WaitWithin(t, 30*time.Second, "the warm-up's access lines", func() bool { o, _ := s.p.counts(); return total2(o) >= 20 })
	}
	for _, nd := range c.nodes {
		nd.p.kill()
	}
	killedAt := time.Now()
	const horizon = 300.0 // ms: standard policy, unit 100ms
	const n = 100
	for _, s := range sides {
		before := len(accessLines(s.p.proc))
		s.p.resetCounts()
		st := load(t, s.p.base+"/api", n, 10, nil)
		if st[s.status] != n {
			t.Fatalf("fail %s: statuses %v, want %d × %d", s.fail, st, n, s.status)
		}
		testkit.WaitWithin(t, 30*time.Second, "access lines", func() bool { return len(accessLines(s.p.proc)) >= before+n })
		lines := accessLines(s.p.proc)[before:]
		for i, l := range lines {
			if l.Outcome != "fail_"+s.fail || l.Cause != "timeout" || l.Status != s.status {
				t.Fatalf("fail %s: access line %d: %+v, want outcome fail_%s cause timeout status %d", s.fail, i, l, s.fail, s.status)
			}
			if l.AdmissionMs < horizon {
				t.Fatalf("fail %s: access line %d: admission_ms %.1f < horizon %v: decided before the request policy ran out", s.fail, i, l.AdmissionMs, horizon)
			}
		}
		if got := s.p.metric(`rl_tproxy_requests_total{location="adm",outcome="fail_` + s.fail + `",service="web"}`); got != n {
			t.Fatalf("fail %s: requests_total fail_%s = %v, want %d", s.fail, s.fail, got, n)
		}
		// The failing checks are announced by a WARN, at most one per 10 s.
		warns := failureWarnings(s.p.proc)
		allowed := 1 + int(time.Since(killedAt)/(10*time.Second))
		if len(warns) == 0 || len(warns) > allowed {
			t.Fatalf("fail %s: %d failure warnings, want 1..%d (one per 10 s)", s.fail, len(warns), allowed)
		}
		if w := warns[0]; w.Cause != "timeout" || w.FailedChecks < 1 {
			t.Fatalf("fail %s: warning %+v, want cause timeout and a count", s.fail, w)
		}
		t.Logf("all nodes down, fail %s: %d × %d, %s; %d warning(s)", s.fail, n, s.status, admissionStats(lines), len(warns))
	}
	// The nodes come back on the same addresses: decisions resume.
	for i := range c.nodes {
		c.restart(i)
	}
	for _, s := range sides {
		s.p.resetCounts()
		probes := 0
		testkit.WaitWithin(t, 30*time.Second, "an allow after the restart", func() bool {
			resp, err := http.Get(s.p.base + "/api")
			if err != nil {
				return false
			}
			resp.Body.Close()
			probes++
			_, causes := s.p.counts()
			return resp.StatusCode == 200 && causes["allow"] > 0
		})
		// A probe's access line is written after its response: wait for
		// every probe's line before counting afresh.
		testkit.WaitWithin(t, 30*time.Second, "the probes' access lines", func() bool {
			o, _ := s.p.counts()
			total := 0
			for _, v := range o {
				total += v
			}
			return total >= probes
		})
		s.p.resetCounts()
		if st := load(t, s.p.base+"/api", 50, 5, nil); st[200] != 50 {
			t.Fatalf("fail %s after restart: statuses %v", s.fail, st)
		}
		testkit.WaitWithin(t, 30*time.Second, "access lines", func() bool { o, _ := s.p.counts(); return o["allow"] >= 50 })
		if o, causes := s.p.counts(); o["allow"] != 50 || causes["allow"] != 50 {
			t.Fatalf("fail %s after restart: outcomes %v causes %v", s.fail, o, causes)
		}
	}
}

// (c) The DNS server stops after start. Refreshes fail (counted in
// rl_tproxy_ratelimitly_resolve_errors_total), the last-known-good
// membership stays in use: 3 endpoints, every admission allowed, /readyz
// still 200.
func TestDNSStoppedLastKnownGood(t *testing.T) {
	c := startCluster(t)
	up := startUpstream(t)
	dir := t.TempDir()
	creds := writeFile(t, filepath.Join(dir, "credentials.yaml"), rlcluster.CredentialYAML(c.cred))
	pol, listen := writePolicy(t, dir, c, policyOpts{fail: "close", unit: "250ms", creds: creds, upstream: up.addr})
	p := startProxy(t, pol, listen, "info", true)
	if st := load(t, p.base+"/api", 20, 4, nil); st[200] != 20 {
		t.Fatalf("warm-up statuses %v", st)
	}
	// Access lines trail responses: let the warm-up's all be counted.
	testkit.WaitWithin(t, 30*time.Second, "the warm-up's access lines", func() bool { o, _ := p.counts(); return total2(o) >= 20 })
	queries := c.dns.Queries()
	c.dns.Close()
	// SRV and A TTLs are 1s (refresh clamped to 5s); failed lookups retry
	// from 500ms. Wait for two failed refreshes.
	testkit.WaitWithin(t, 60*time.Second, "two failed discovery refreshes", func() bool {
		return p.metric("rl_tproxy_ratelimitly_resolve_errors_total") >= 2
	})
	p.resetCounts()
	const n = 200
	if st := load(t, p.base+"/api", n, 8, nil); st[200] != n {
		t.Fatalf("statuses %v, want %d × 200", st, n)
	}
	testkit.WaitWithin(t, 30*time.Second, "access lines", func() bool { o, _ := p.counts(); return total2(o) >= n })
	if o, causes := p.counts(); o["allow"] != n || causes["allow"] != n {
		t.Fatalf("outcomes %v causes %v: want %d allows from the last-known-good membership", o, causes, n)
	}
	body := p.scrape()
	if got := seriesValue(body, "rl_tproxy_ratelimitly_endpoints"); got != 3 {
		t.Fatalf("endpoints %v after DNS stopped, want 3 (last known good)", got)
	}
	resp, err := http.Get("http://" + p.admin + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("/readyz %d after DNS stopped", resp.StatusCode)
	}
	t.Logf("DNS stopped after %d queries; %v resolve errors; %d requests allowed; warnings: %s", queries,
		seriesValue(body, "rl_tproxy_ratelimitly_resolve_errors_total"), n, firstMatching(p.lines(), "resolve", "discovery", "lookup"))
}

func total2(m map[string]int) int {
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}

// firstMatching returns the first non-access line containing any of words.
func firstMatching(lines []string, words ...string) string {
	for _, l := range lines {
		if strings.Contains(l, `"msg":"access"`) {
			continue
		}
		for _, w := range words {
			if strings.Contains(l, w) && strings.Contains(l, `"level":"WARN"`) {
				return l
			}
		}
	}
	return "(none)"
}

// failureWarning is the client's rate-limited WARN about checks that end
// without a RateLimitly decision.
type failureWarning struct {
	Level        string `json:"level"`
	Msg          string `json:"msg"`
	Cause        string `json:"cause"`
	FailedChecks int    `json:"failed_checks"`
}

func failureWarnings(p *proc) []failureWarning {
	var out []failureWarning
	for _, l := range p.lines() {
		var w failureWarning
		if json.Unmarshal([]byte(l), &w) == nil && w.Level == "WARN" && strings.HasPrefix(w.Msg, "rlclient: checks end without a RateLimitly decision") {
			out = append(out, w)
		}
	}
	return out
}
