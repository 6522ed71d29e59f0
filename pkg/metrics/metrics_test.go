package metrics

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/rl-tproxy/rl-tproxy/internal/testkit"
)

func populated(t *testing.T) *Metrics {
	t.Helper()
	m := New("test", "abc123")
	l := m.Location("web", "api", "checkout", 429)
	for i := range Outcomes {
		l.Requests[i].Inc()
	}
	l.Admission.Observe(0.003)
	l.Reports.Inc()
	l.Upstream.Inc()
	l.Deny.Inc()
	m.Cause("deny_resource").Inc()
	m.Cause("timeout").Inc()
	m.LocalFallback(true)
	m.LocalFallback(false)
	m.Reload("success", "signal", 0)
	m.Reload("error", "file", 3)
	m.PolicyLoaded(2, 1.7e9)
	m.ClientRebuilt()
	m.SetClientStats(func() ClientStats {
		return ClientStats{Ready: true, Endpoints: 3, Sent: 10, Received: 9, Dropped: map[string]uint64{"auth": 1, "stale": 2},
			ByCause: map[string]uint64{"allow": 5, "timeout": 1}}
	})
	m.SetServerStats(func() ServerStats {
		return ServerStats{Requests: 4, Allows: 3, Denies: 1, Dropped: map[string]uint64{"auth": 1}}
	})
	m.SetProxyStats(func() ProxyStats {
		return ProxyStats{OpenConnections: 2, UpstreamIdle: 11, EventLoops: 2, LoopTurns: 900, LoopParks: 40, LoopKernelWaits: 7, LoopBuffers: 3, LoopStarved: 1, LoopSpliced: 5,
			UpstreamLookups: 9, UpstreamLookupErrors: 2}
	})
	return m
}

func scrape(t *testing.T, h http.Handler, path string) (int, string) {
	t.Helper()
	a, err := StartAdmin("127.0.0.1:0", h)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := a.Close(context.Background()); err != nil {
			t.Error(err)
		}
	}()
	resp, err := http.Get("http://" + a.Addr().String() + path)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(b)
}

// Every documented metric family appears in a scrape, and docs/metrics.md
// names every rl_tproxy family the registry exports.
func TestScrapeHasEveryFamily(t *testing.T) {
	m := populated(t)
	code, body := scrape(t, m.Handler(&Readiness{}), "/metrics")
	if code != 200 {
		t.Fatalf("status %d", code)
	}
	fams, err := m.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	doc, err := readDoc()
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, f := range fams {
		name := f.GetName()
		if !strings.HasPrefix(name, Namespace+"_") {
			continue
		}
		n++
		if !strings.Contains(body, "# TYPE "+name+" ") {
			t.Errorf("scrape lacks %s", name)
		}
		if !strings.Contains(doc, "`"+name+"`") {
			t.Errorf("docs/metrics.md does not document %s", name)
		}
	}
	if n < 25 {
		t.Errorf("only %d rl_tproxy families exported", n)
	}
	for _, want := range []string{
		`rl_tproxy_requests_total{location="api",outcome="shadow_deny",service="web"} 1`,
		`rl_tproxy_ratelimitly_endpoints 3`,
		`rl_tproxy_ratelimitly_datagrams_dropped_total{reason="stale"} 2`,
		`rl_tproxy_policy_reload_errors_total 3`,
		`rl_tproxy_policy_generation 2`,
		`rl_tproxy_open_connections 2`,
		`rl_tproxy_event_loops 2`,
		`rl_tproxy_event_loop_turns_total 900`,
		`rl_tproxy_event_loop_waits_total{how="netpoller"} 40`,
		`rl_tproxy_event_loop_waits_total{how="kernel"} 7`,
		`rl_tproxy_event_loop_buffers 3`,
		`rl_tproxy_event_loop_starved_total 1`,
		`rl_tproxy_event_loop_spliced_bytes_total 5`,
		`rl_tproxy_upstream_lookups_total{result="ok"} 7`,
		`rl_tproxy_upstream_lookups_total{result="failed"} 2`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("scrape lacks %q", want)
		}
	}
}

func TestPromtoolCheckMetrics(t *testing.T) {
	promtool := testkit.NeedTool(t, "promtool", "prometheus")
	m := populated(t)
	_, body := scrape(t, m.Handler(&Readiness{}), "/metrics")
	cmd := exec.Command(promtool, "check", "metrics")
	cmd.Stdin = strings.NewReader(body)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		t.Fatalf("promtool check metrics: %v\n%s", err, out.String())
	}
}

func TestReadiness(t *testing.T) {
	r := &Readiness{}
	m := New("t", "c")
	h := m.Handler(r)
	if code, _ := scrape(t, h, "/readyz"); code != 503 {
		t.Fatalf("no checks: status %d, want 503", code)
	}
	if code, body := scrape(t, h, "/healthz"); code != 200 || body != "ok\n" {
		t.Fatalf("healthz %d %q", code, body)
	}
	var discovery error = errors.New("no SRV answer yet")
	r.Set("policy", func() error { return nil })
	r.Set("discovery", func() error { return discovery })
	code, body := scrape(t, h, "/readyz")
	if code != 503 || !strings.Contains(body, "fail discovery: no SRV answer yet") || !strings.Contains(body, "ok policy") {
		t.Fatalf("readyz %d %q", code, body)
	}
	discovery = nil
	if code, body := scrape(t, h, "/readyz"); code != 200 {
		t.Fatalf("readyz %d %q", code, body)
	}
	r.Set("discovery", nil)
	if code, _ := scrape(t, h, "/readyz"); code != 200 {
		t.Fatalf("after removing a check: %d", code)
	}
}

func TestCauseCounterCached(t *testing.T) {
	m := New("t", "c")
	if m.Cause("timeout") != m.Cause("timeout") {
		t.Fatal("cause counter not cached")
	}
}

func readDoc() (string, error) {
	b, err := os.ReadFile("../../docs/metrics.md")
	return string(b), err
}

// Two processes (here: two listeners) can hold the same admin address
// during a rolling update; a port-0 admin address is never shared.
func TestAdminReusePort(t *testing.T) {
	m := New("t", "c")
	free, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := free.Addr().String()
	free.Close()
	a, err := StartAdmin(addr, m.Handler(&Readiness{}))
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close(context.Background())
	b, err := StartAdmin(addr, m.Handler(&Readiness{}))
	if err != nil {
		t.Fatalf("second admin listener on %s: %v", addr, err)
	}
	if err := b.Close(context.Background()); err != nil {
		t.Fatal(err)
	}

	eph, err := StartAdmin("127.0.0.1:0", m.Handler(&Readiness{}))
	if err != nil {
		t.Fatal(err)
	}
	defer eph.Close(context.Background())
	if c, err := StartAdmin(eph.Addr().String(), m.Handler(&Readiness{})); err == nil {
		c.Close(context.Background())
		t.Fatalf("a second listener joined the ephemeral admin port %s", eph.Addr())
	}
}

// Prune deletes the denial series of a zone a kept location stopped
// listing, and keeps everything asked for again.
func TestPruneKeptLocation(t *testing.T) {
	m := New("test", "abc")
	m.Location("web", "api", "", 429).Requests[0].Inc()
	m.Denial("web", "api", DenialZone, "old").Inc()
	m.Prune()
	m.Location("web", "api", "", 429)
	m.Denial("web", "api", DenialZone, "new")
	m.Prune()
	fams, err := m.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, f := range fams {
		for _, s := range f.GetMetric() {
			line := f.GetName()
			for _, l := range s.GetLabel() {
				line += " " + l.GetName() + "=" + l.GetValue()
			}
			if c := s.GetCounter(); c != nil && c.GetValue() > 0 {
				line += " >0"
			}
			got = append(got, line)
		}
	}
	all := strings.Join(got, "\n")
	if strings.Contains(all, "name=old") || !strings.Contains(all, "name=new") {
		t.Errorf("denial series after the zone was renamed:\n%s", all)
	}
	if !strings.Contains(all, "rl_tproxy_requests_total location=api outcome=allow service=web >0") {
		t.Errorf("the kept location lost its count:\n%s", all)
	}
}
