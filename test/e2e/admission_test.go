package e2e

import (
	"fmt"
	"io"
	"net"
	"net/netip"
	"os/exec"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rl-tproxy/rl-tproxy/internal/dnstest"
	"github.com/rl-tproxy/rl-tproxy/internal/testkit"
)

// A burst against a 5/m zone with burst 3: three 200s, then 429 with
// Retry-After rounded up from retry_after_ms (one token at 5/m = 12s) and
// the IETF RateLimit fields; the upstream's own fields pass on allows.
func TestBurstThen429(t *testing.T) {
	e := newEnv(t, nil, policyOpts{})
	for i := 0; i < 3; i++ {
		r := e.get(t, "/api/items", "X-Key: alice")
		if r.status != 200 {
			t.Fatalf("request %d: %d", i, r.status)
		}
		if got := r.header.Values("RateLimit"); len(got) != 1 || got[0] != `"upstream";r=1;t=9` {
			t.Fatalf("upstream RateLimit on allow changed: %q", got)
		}
	}
	r := e.get(t, "/api/items", "X-Key: alice")
	if r.status != 429 {
		t.Fatalf("4th request: %d", r.status)
	}
	// One token at 5/m takes 12s; the bucket refilled a little since the
	// third request (a slow machine may take over a second between curls),
	// so the rounded-up value is 12, or 11 after a very long pause.
	ra := r.header.Get("Retry-After")
	if ra != "12" && ra != "11" {
		t.Errorf("Retry-After %q, want 12", ra)
	}
	if got := r.header.Get("RateLimit-Policy"); got != `"strict";q=5;w=60` {
		t.Errorf("RateLimit-Policy %q", got)
	}
	if got := r.header.Get("RateLimit"); got != `"strict";r=0;t=`+ra {
		t.Errorf("RateLimit %q, want r=0 and t equal to Retry-After %s", got, ra)
	}
	if !strings.Contains(r.body, `"status":429`) {
		t.Errorf("deny body %q", r.body)
	}
	// Another key has its own bucket.
	if r := e.get(t, "/api/items", "X-Key: bob"); r.status != 200 {
		t.Fatalf("other key: %d", r.status)
	}
	l := e.p.waitAccess(4)
	if l["verdict"] != "deny" || l["outcome"] != "deny" || l["cause"] != "deny_resource" || l["status"] != float64(429) || l["location"] != "api" {
		t.Fatalf("access line of the deny: %v", l)
	}
	if e.up.hits.Load() != 4 {
		t.Fatalf("upstream saw %d requests, want 4 (the deny must not reach it)", e.up.hits.Load())
	}
}

// Slow responses are reported, the guard trips, and fast reports (from a
// report-only location on the same tracker) bring it back.
func TestGuardTripsAndRecovers(t *testing.T) {
	e := newEnv(t, nil, policyOpts{})
	if r := e.get(t, "/guarded"); r.status != 200 {
		t.Fatalf("fast guarded request: %d", r.status)
	}
	testkit.WaitFor(t, "the fast request's report", func() bool { return e.c.Reports() >= 3 })
	e.up.delay.Store(int64(150 * time.Millisecond))
	before := e.c.Reports()
	tripped, slow := false, 0
	for i := 0; i < 10 && !tripped; i++ {
		r := e.get(t, "/guarded")
		switch r.status {
		case 429:
			tripped = true
			if r.header.Get("Retry-After") != "5" || !strings.Contains(r.body, "latency guard tripped") {
				t.Errorf("guard deny Retry-After %q (want deny.guard_retry_after's default 5), body %q", r.header.Get("Retry-After"), r.body)
			}
		case 200:
			slow++
		default:
			t.Fatalf("status %d", r.status)
		}
	}
	if !tripped {
		t.Fatal("guard never tripped after 10 slow (150ms > 100ms) reported responses")
	}
	// Each admitted slow response was reported once to each of the 3
	// servers; the guard deny was not.
	testkit.WaitFor(t, "the slow responses' reports", func() bool { return e.c.Reports()-before >= uint64(3*slow) })
	if got := e.c.Reports() - before; got != uint64(3*slow) {
		t.Errorf("servers applied %d reports for %d slow responses, want %d", got, slow, 3*slow)
	}
	// The access line is written after the 429 reached the client.
	var deny map[string]any
	testkit.WaitFor(t, "the guard deny's access line", func() bool {
		for _, l := range e.p.access() {
			if l["status"] == float64(429) {
				deny = l
			}
		}
		return deny != nil
	})
	if deny["cause"] != "deny_guard" || deny["verdict"] != "deny" {
		t.Fatalf("guard deny access line %v", deny)
	}
	e.up.delay.Store(0)
	recovered := false
	for i := 0; i < 400 && !recovered; i++ {
		if r := e.get(t, "/probe"); r.status != 200 {
			t.Fatalf("probe %d", r.status)
		}
		if i%10 == 9 {
			recovered = e.get(t, "/guarded").status == 200
		}
	}
	if !recovered {
		t.Fatal("guard did not recover after fast reports")
	}
}

// Every row of the failure table under open, close and local, through
// the real binary: status, verdict, outcome, cause in the access log, and
// reports (at most one, only after completed work) counted at the servers.
// The internal-failure row (500) cannot be caused from outside; the unit
// table in pkg/admission covers it.
func TestFailureTable(t *testing.T) {
	c := startCluster(t)
	modes := []string{"open", "close", "local"}
	good, wrongKey, noSRV, bcast := map[string]*env{}, map[string]*env{}, map[string]*env{}, map[string]*env{}
	// An endpoint the kernel refuses to send to: the limited broadcast
	// address without SO_BROADCAST (sendto fails with EACCES).
	c.DNS.SetSRV("_bcast._udp.e2e.test.", dnstest.Target{Name: "bcast.e2e.test.", Port: 9, Addrs: []netip.Addr{netip.MustParseAddr("255.255.255.255")}})
	baseReports := c.Reports()
	for _, mode := range modes {
		good[mode] = newEnv(t, c, policyOpts{fail: mode})
		bad := newCredential(t, c.cred.KeyID) // same key id, another secret
		wrongKey[mode] = newEnv(t, c, policyOpts{fail: mode, credentials: writeCredentials(t, t.TempDir(), bad), notReady: true})
		noSRV[mode] = newEnv(t, c, policyOpts{fail: mode, srv: "_missing._udp.e2e.test.", notReady: true})
		bcast[mode] = newEnv(t, c, policyOpts{fail: mode, srv: "_bcast._udp.e2e.test."})
		// Exhaust one key per proxy with valid allows (burst 3).
		for i := 0; i < 3; i++ {
			if r := good[mode].get(t, "/api/a", "X-Key: exhausted-"+mode); r.status != 200 {
				t.Fatalf("%s warm-up %d: %d", mode, i, r.status)
			}
		}
	}
	// Each warm-up allow reports to the 3 servers: let those reports land
	// before the rows count reports of their own.
	testkit.WaitFor(t, "the warm-up reports at the servers", func() bool {
		return c.Reports() >= baseReports+uint64(3*3*len(modes))
	})
	failStatus := map[string]int{"open": 200, "close": 429, "local": 200}
	all := func(s int) map[string]int { return map[string]int{"open": s, "close": s, "local": s} }
	rows := []struct {
		name          string
		envs          map[string]*env
		toggle        *atomic.Bool
		path, key     string
		status        map[string]int
		verdict       string
		causes        string // accepted causes, |-separated
		outcome       string // "" = fail_<mode>
		serversReport bool   // the servers can receive this row's reports
	}{
		{"valid allow", good, nil, "/api/a", "fresh", all(200), "allow", "allow", "allow", true},
		{"valid resource deny", good, nil, "/api/a", "exhausted", all(429), "deny", "deny_resource", "deny", true},
		{"no usable discovery target", noSRV, nil, "/api/a", "k", failStatus, "-", "no_endpoints", "", false},
		{"UDP send failure", bcast, nil, "/api/a", "k", failStatus, "-", "send_failure", "", false},
		{"response timeout", good, &c.dropRequests, "/api/a", "k-timeout", failStatus, "-", "timeout", "", true},
		// A wrong key fails authentication at the servers, which drop the
		// datagram: the client sees no valid answer (timeout or protocol).
		{"authentication failure", wrongKey, nil, "/api/a", "k", failStatus, "-", "timeout|protocol", "", false},
		{"cardinality mismatch", good, &c.extraResult, "/api/a", "k-card", failStatus, "-", "cardinality", "", true},
		{"invalid dynamic value: empty bucket", good, nil, "/dyn/a", "", failStatus, "-", "invalid_value", "", true},
		{"invalid dynamic value: bucket over 1024 bytes", good, nil, "/dyn/a", strings.Repeat("b", 1100), failStatus, "-", "invalid_value", "", true},
	}
	for _, rw := range rows {
		t.Run(rw.name, func(t *testing.T) {
			if rw.toggle != nil {
				rw.toggle.Store(true)
				defer rw.toggle.Store(false)
			}
			for _, mode := range modes {
				e := rw.envs[mode]
				var hdr []string
				if rw.key != "" {
					key := rw.key
					if len(key) < 100 {
						key += "-" + mode // the cluster is shared: one bucket per mode
					}
					hdr = []string{"X-Key: " + key}
				}
				before := c.Reports()
				n := len(e.p.access())
				r := e.get(t, rw.path, hdr...)
				if r.status != rw.status[mode] {
					t.Errorf("%s: status %d, want %d", mode, r.status, rw.status[mode])
					continue
				}
				l := e.p.waitAccess(n + 1)
				if !strings.Contains("|"+rw.causes+"|", "|"+fmt.Sprint(l["cause"])+"|") {
					t.Errorf("%s: cause %v, want %s", mode, l["cause"], rw.causes)
				}
				outcome := rw.outcome
				if outcome == "" {
					outcome = "fail_" + mode
				}
				if l["outcome"] != outcome || l["verdict"] != rw.verdict {
					t.Errorf("%s: verdict %v outcome %v, want %s %s", mode, l["verdict"], l["outcome"], rw.verdict, outcome)
				}
				wantReport := r.status == 200 // completed work reports; deny and fail-close never
				if got := l["report"] == true; got != wantReport {
					t.Errorf("%s: report %v, want %v", mode, got, wantReport)
				}
				if !rw.serversReport {
					continue
				}
				want := uint64(0)
				if wantReport {
					// One report, fanned out to each of the 3 servers.
					want = 3
					testkit.WaitFor(t, "the report at the servers", func() bool { return c.Reports() >= before+3 })
				}
				// Reports are sent in Done, before the access line is
				// written: by now a report would have been applied or is
				// in the servers' socket queues, which the next check's
				// answers follow. Nothing else is in flight.
				if got := c.Reports() - before; got != want {
					t.Errorf("%s: servers applied %d reports, want %d", mode, got, want)
				}
			}
		})
	}
}

// A client that goes away while its check is in flight gets no report and
// no verdict: outcome client_abort, cause cancelled.
func TestClientAbortNoReport(t *testing.T) {
	// curl must exist: its failure (the abort) is what this test expects.
	testkit.NeedTool(t, "curl", "curl")
	e := newEnv(t, nil, policyOpts{})
	before := e.c.Reports()
	e.c.dropRequests.Store(true) // the check waits for the whole horizon (750ms)
	out, err := exec.Command("curl", "-s", "--max-time", "0.3", "-H", "X-Key: abort", e.p.base+"/api/slow").CombinedOutput()
	e.c.dropRequests.Store(false)
	if err == nil {
		t.Fatalf("curl did not time out: %s", out)
	}
	l := e.p.waitAccess(1)
	if l["outcome"] != "client_abort" || l["verdict"] != "-" || l["cause"] != "cancelled" || l["report"] != false {
		t.Fatalf("access line %v", l)
	}
	if e.up.hits.Load() != 0 {
		t.Fatal("an aborted request reached the upstream")
	}
	// A completed request afterwards reports once (to 3 servers): the
	// aborted one added nothing.
	if r := e.get(t, "/api/fast", "X-Key: abort2"); r.status != 200 {
		t.Fatalf("status %d", r.status)
	}
	testkit.WaitFor(t, "the completed request's report", func() bool { return e.c.Reports() >= before+3 })
	if got := e.c.Reports() - before; got != 3 {
		t.Fatalf("servers applied %d reports, want 3 (one request, fanned out)", got)
	}
}

// A zone whose rate comes from a tier keyed by the X-Plan header (the
// free/pro example of docs/policy.md): the free key is denied after its 10
// per minute, the pro key (1000/m) passes every request.
func TestTiersFreeDeniedProPasses(t *testing.T) {
	e := newEnv(t, nil, policyOpts{
		tiers: "tiers:\n  plan:\n    key: \"{header.x-plan}\"\n    values: {free: 10/m, pro: 1000/m}\n    default: 10/m\n",
		zones: "  per_key: {bucket: \"key:{header.x-key}\", rate: {tier: plan}}\n",
		extra: "      - name: tiered\n        match: {path_prefix: /tiered}\n        limit: [per_key]\n",
	})
	const n = 25
	var free, pro [600]int
	policyField := "unset"
	start := time.Now()
	for i := 0; i < n; i++ {
		r := e.get(t, "/tiered", "X-Key: alice", "X-Plan: free")
		if i < 10 && r.status != 200 {
			t.Fatalf("free request %d: %d, want 200 (within its 10 per minute)", i, r.status)
		}
		if r.status == 429 {
			policyField = r.header.Get("RateLimit-Policy")
		}
		free[r.status]++
		pro[e.get(t, "/tiered", "X-Key: bob", "X-Plan: pro").status]++
	}
	// At 10/m a token comes back every 6 s: a slow run earns that many more.
	refilled := int(time.Since(start) / (6 * time.Second))
	if free[200] > 10+refilled || free[429] != n-free[200] || free[429] == 0 {
		t.Fatalf("free key: %d × 200, %d × 429; want 10 (+%d refilled) allowed, the rest denied", free[200], free[429], refilled)
	}
	if pro[200] != n {
		t.Fatalf("pro key: %d × 200 of %d", pro[200], n)
	}
	if policyField != "" {
		t.Errorf("RateLimit-Policy %q on the free key's deny: a tiered quota has no single value to announce", policyField)
	}
	if r := e.get(t, "/tiered", "X-Key: carol"); r.status != 200 {
		t.Fatalf("no plan (default 10/m): %d", r.status)
	}
}

// A client that shuts down its write side (FIN) while the upstream works
// on its admitted request aborts it, as nginx does by default: no answer,
// outcome client_abort, verdict -, no report, and the upstream exchange
// cancelled (the upstream sees its request's context end).
func TestClientFINAbortsInFlight(t *testing.T) {
	e := newEnv(t, nil, policyOpts{})
	before := e.c.Reports()
	c, err := net.Dial("tcp", strings.TrimPrefix(e.p.base, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(testkit.WaitBound))
	if _, err := io.WriteString(c, "GET /hold/fin HTTP/1.1\r\nHost: e2e\r\nX-Key: fin\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	waitChan(t, e.up.held, "the upstream to get the request")
	if err := c.(*net.TCPConn).CloseWrite(); err != nil {
		t.Fatal(err)
	}
	if got, err := io.ReadAll(c); err != nil || len(got) != 0 {
		t.Fatalf("after the FIN the client read %q (%v), want the connection closed with no answer", got, err)
	}
	if p := waitChan(t, e.up.cancelled, "the upstream exchange to be cancelled"); p != "/hold/fin" {
		t.Fatalf("cancelled %q", p)
	}
	l := e.p.waitAccess(1)
	if l["outcome"] != "client_abort" || l["verdict"] != "-" || l["report"] != false || l["status"] != float64(0) || l["location"] != "api" {
		t.Fatalf("access line %v", l)
	}
	if v := e.p.metric(`rl_tproxy_requests_total{location="api",outcome="client_abort",service="web"}`); v != 1 {
		t.Fatalf("client_abort metric %v", v)
	}
	// A completed request afterwards reports once (to 3 servers): the
	// aborted one added nothing.
	if r := e.get(t, "/api/fast", "X-Key: fin2"); r.status != 200 {
		t.Fatalf("status %d", r.status)
	}
	testkit.WaitFor(t, "the completed request's report", func() bool { return e.c.Reports() >= before+3 })
	if got := e.c.Reports() - before; got != 3 {
		t.Fatalf("servers applied %d reports, want 3 (one request, fanned out)", got)
	}
}

// waitChan receives from ch; the bound is a hang guard.
func waitChan[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(testkit.WaitBound):
		t.Fatalf("timed out waiting for %s", what)
	}
	var zero T
	return zero
}

// A guard deny's answer through the real binary, at a location with a
// zone that still has quota: its own body, Retry-After from
// deny.guard_retry_after, RateLimit-Policy but no RateLimit field (quota
// left would contradict the deny). With deny.guard_probe, one request
// the guard denies is admitted as a probe (outcome guard_probe, verdict
// deny) and reported, so the tracker hears whether the service recovered.
func TestGuardDenyAnswerAndProbe(t *testing.T) {
	e := newEnv(t, nil, policyOpts{extra: `      - name: probed
        match: {path_prefix: /probed}
        limit: [dyn]
        guard: [{tracker: slow, threshold: 100ms}]
        report: slow
        deny: {guard_retry_after: 3s, guard_probe: 1/m}
`})
	e.up.delay.Store(int64(150 * time.Millisecond))
	var deny curlResult
	for i := 0; i < 20 && deny.status == 0; i++ {
		// dyn: 100/s, burst 2; each key has quota left when the guard trips.
		r := e.get(t, "/probed/x", fmt.Sprintf("X-Key: p%d", i))
		switch r.status {
		case 200:
		case 429:
			deny = r
		default:
			t.Fatalf("status %d", r.status)
		}
	}
	if deny.status != 429 {
		t.Fatal("the guard never denied after 20 slow (150ms > 100ms) reported responses")
	}
	if got := deny.header.Get("Retry-After"); got != "3" {
		t.Errorf("Retry-After %q, want 3 (deny.guard_retry_after)", got)
	}
	if got := deny.header.Get("RateLimit"); got != "" {
		t.Errorf("RateLimit %q on a guard deny with quota left", got)
	}
	if got := deny.header.Get("RateLimit-Policy"); got != `"dyn";q=100;w=1` {
		t.Errorf("RateLimit-Policy %q", got)
	}
	if !strings.Contains(deny.body, `"error":"service overloaded: latency guard tripped"`) {
		t.Errorf("guard deny body %q", deny.body)
	}
	var probe, denied map[string]any
	testkit.WaitFor(t, "the probe's and the deny's access lines", func() bool {
		for _, l := range e.p.access() {
			switch l["outcome"] {
			case "guard_probe":
				probe = l
			case "deny":
				denied = l
			}
		}
		return probe != nil && denied != nil
	})
	if probe["verdict"] != "deny" || probe["cause"] != "deny_guard" || probe["status"] != float64(200) || probe["report"] != true {
		t.Fatalf("probe access line %v", probe)
	}
	if denied["deny_guards"] != "slow" || denied["retry_after"] != float64(3) || denied["report"] != false {
		t.Fatalf("guard deny access line %v", denied)
	}
	if v := e.p.metric(`rl_tproxy_requests_total{location="probed",outcome="guard_probe",service="web"}`); v != 1 {
		t.Fatalf("guard_probe metric %v, want 1 (1/m: one probe)", v)
	}
}

// deny.guard_probe is how a tripped guard sees recovery without any
// other traffic: slow reports (from the report-only /probe location) trip
// the guard of /probed; then, with the service fast again and only
// /probed requests arriving, its probes' fast reports bring the estimate
// under the threshold and plain allows return. Without probes no report
// would reach the tracker until the slow samples aged out (60 s).
func TestGuardProbesShowRecovery(t *testing.T) {
	e := newEnv(t, nil, policyOpts{extra: `      - name: probed
        match: {path_prefix: /probed}
        guard: [{tracker: slow, threshold: 100ms}]
        report: slow
        deny: {guard_probe: 5/s}
`})
	e.up.delay.Store(int64(150 * time.Millisecond))
	for i := 0; i < 3; i++ {
		if r := e.get(t, "/probe"); r.status != 200 {
			t.Fatalf("slow report-only request: %d", r.status)
		}
	}
	testkit.WaitFor(t, "the slow reports", func() bool { return e.c.Reports() >= 9 })
	e.up.delay.Store(0)
	series := func(outcome string) string {
		return `rl_tproxy_requests_total{location="probed",outcome="` + outcome + `",service="web"}`
	}
	recovered := false
	for i := 0; i < 600 && !recovered; i++ {
		if r := e.get(t, "/probed/x"); r.status != 200 && r.status != 429 {
			t.Fatalf("status %d", r.status)
		}
		if i%10 == 9 {
			recovered = e.p.metric(series("allow")) > 0
		}
	}
	probes, denies := e.p.metric(series("guard_probe")), e.p.metric(series("deny"))
	if !recovered {
		t.Fatalf("the guard never recovered: %v probes, %v denies", probes, denies)
	}
	if probes == 0 {
		t.Fatal("recovered without a probe: the guard had not tripped")
	}
	t.Logf("recovered after %v probes and %v guard denies", probes, denies)
}
