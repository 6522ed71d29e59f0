package deploy

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/rl-tproxy/rl-tproxy/internal/testkit"
)

const dashboardFile = "grafana/rl-tproxy.json"

// dashboardExprs returns every PromQL expression of a Grafana dashboard:
// panel and annotation targets (key "expr", at any depth) and the metric
// of each label_values() variable query.
func dashboardExprs(t *testing.T, raw []byte) []string {
	t.Helper()
	var doc any
	if err := json.Unmarshal(raw, &doc); err != nil {
		t.Fatalf("%s: %v", dashboardFile, err)
	}
	labelValues := regexp.MustCompile(`^label_values\(\s*([^,)]+)`)
	var out []string
	var walk func(v any)
	walk = func(v any) {
		switch v := v.(type) {
		case map[string]any:
			for k, c := range v {
				s, ok := c.(string)
				switch {
				case ok && k == "expr":
					out = append(out, s)
				case ok && k == "definition":
					if m := labelValues.FindStringSubmatch(s); m != nil {
						out = append(out, strings.TrimSpace(m[1]))
					}
				default:
					walk(c)
				}
			}
		case []any:
			for _, c := range v {
				walk(c)
			}
		}
	}
	walk(doc)
	sort.Strings(out)
	return out
}

var grafanaVar = regexp.MustCompile(`\$\{?(\w+)\}?`)

// substituteVars replaces Grafana's variables by what a query would see:
// intervals become 5m, the instance variable the regex ".*".
func substituteVars(expr string) string {
	return grafanaVar.ReplaceAllStringFunc(expr, func(v string) string {
		if strings.Contains(v, "__") {
			return "5m"
		}
		return ".*"
	})
}

var (
	promString   = regexp.MustCompile(`"(?:[^"\\]|\\.)*"`)
	promMatchers = regexp.MustCompile(`\{[^}]*\}`)
	promRange    = regexp.MustCompile(`\[[^\]]*\]|\boffset\s+-?\w+|@\s*\S+`)
	promGrouping = regexp.MustCompile(`\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)`)
	promIdent    = regexp.MustCompile(`[a-zA-Z_:][a-zA-Z0-9_:]*\s*\(?`)
	promKeywords = []string{"and", "or", "unless", "bool", "offset", "by", "without", "on", "ignoring",
		"group_left", "group_right", "inf", "nan", "Inf", "NaN"}
)

// metricNames lists the metric names a PromQL expression selects: the
// identifiers left once strings, label matchers, ranges and grouping
// label lists are gone, minus function calls and keywords.
func metricNames(expr string) []string {
	s := promString.ReplaceAllString(expr, `""`)
	s = promMatchers.ReplaceAllString(s, " ")
	s = promRange.ReplaceAllString(s, " ")
	s = promGrouping.ReplaceAllString(s, " ")
	var out []string
	for _, tok := range promIdent.FindAllString(s, -1) {
		tok = strings.TrimSpace(tok)
		if strings.HasSuffix(tok, "(") || slices.Contains(promKeywords, tok) {
			continue
		}
		if !slices.Contains(out, tok) {
			out = append(out, tok)
		}
	}
	return out
}

func TestMetricNames(t *testing.T) {
	for _, c := range []struct {
		expr string
		want []string
	}{
		{`sum by (outcome) (rate(rl_tproxy_requests_total{instance=~".*", a="b{c}"}[5m]))`, []string{"rl_tproxy_requests_total"}},
		{`histogram_quantile(0.99, sum by (le) (rate(x_bucket[5m]))) / on (job) group_left (v) y offset 1m`, []string{"x_bucket", "y"}},
		{`time() - max(a) and b or c unless d > bool 1`, []string{"a", "b", "c", "d"}},
		{`label_replace(up, "dst", "$1", "src", "(.*)")`, []string{"up"}},
		{`rl_tproxy_build_info`, []string{"rl_tproxy_build_info"}},
	} {
		if got := metricNames(c.expr); !slices.Equal(got, c.want) {
			t.Errorf("metricNames(%q) = %q, want %q", c.expr, got, c.want)
		}
	}
}

// runForScrape runs the binary (embedded RateLimitly, one listener-mode
// service with a zone, a guard and a report), sends allowed and denied
// requests and one the proxy rejects, so that labelled families have
// series, and returns a scrape of its /metrics.
func runForScrape(t *testing.T) string {
	t.Helper()
	bin := builtBinary(t)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok\n") }))
	t.Cleanup(up.Close)
	listen := freeLoopback(t)
	policy := filepath.Join(t.TempDir(), "policy.yaml")
	body := fmt.Sprintf(`ratelimitly: {embedded: true, fail: close}
zones:
  per_client: {bucket: "client:{remote_addr}", rate: 1/h, burst: 2}
trackers:
  api: {service: "api:{host}"}
services:
  - name: web
    listen: %s
    upstream: %s
    locations:
      - name: api
        limit: [per_client]
        guard: [{tracker: api, threshold: 10s}]
        report: api
`, listen, up.Listener.Addr())
	if err := os.WriteFile(policy, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	p := startProxy(t, exec.Command(bin, "run", "--policy", policy, "--admin", "127.0.0.1:0", "--log-format", "json", "--watch=false"))
	p.waitFor(t, "admin listener")
	var rec struct {
		Addr string `json:"addr"`
	}
	if err := json.Unmarshal([]byte(p.log[len(p.log)-1]), &rec); err != nil || rec.Addr == "" {
		t.Fatalf("admin listener line %q: %v", p.log[len(p.log)-1], err)
	}
	p.waitFor(t, "rl-tproxy running")
	statuses := map[int]int{}
	for range 4 {
		resp, err := http.Get("http://" + listen + "/x")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		statuses[resp.StatusCode]++
	}
	if statuses[200] == 0 || statuses[429] == 0 {
		t.Fatalf("want allowed and denied requests, got %v", statuses)
	}
	// And one request the proxy rejects itself (HTTP/1.1 without Host).
	c, err := net.Dial("tcp", listen)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(c, "GET /x HTTP/1.1\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	if b, _ := io.ReadAll(c); !strings.HasPrefix(string(b), "HTTP/1.1 400 ") {
		t.Fatalf("request without Host: %q", b)
	}
	resp, err := http.Get("http://" + rec.Addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("scrape: %d %v", resp.StatusCode, err)
	}
	return string(b)
}

func freeLoopback(t *testing.T) string {
	t.Helper()
	return testkit.FreeAddr(t)
}

// scrapeSeries returns the series of a text exposition (one per sample
// line, labels as written) and the set of sample names.
func scrapeSeries(scrape string) (series []string, names map[string]bool) {
	names = map[string]bool{}
	for _, l := range strings.Split(scrape, "\n") {
		if l == "" || strings.HasPrefix(l, "#") {
			continue
		}
		i := strings.LastIndexByte(l, ' ')
		if i <= 0 {
			continue
		}
		s := l[:i]
		series = append(series, s)
		names[strings.SplitN(s, "{", 2)[0]] = true
	}
	return series, names
}

// promtoolRun writes the dashboard's expressions as recording rules and a
// promtool unit test whose input is the scrape and which asserts that no
// metric name used is absent(); it returns promtool's verdict.
func promtoolRun(t *testing.T, bin string, exprs, names, series []string) (string, error) {
	t.Helper()
	dir := t.TempDir()
	type rule struct {
		Record string `json:"record"`
		Expr   string `json:"expr"`
	}
	rules := make([]rule, len(exprs))
	for i, e := range exprs {
		rules[i] = rule{Record: fmt.Sprintf("dashboard:expr_%d", i), Expr: e}
	}
	type input struct {
		Series string `json:"series"`
		Values string `json:"values"`
	}
	type exprTest struct {
		Expr       string `json:"expr"`
		EvalTime   string `json:"eval_time"`
		ExpSamples []any  `json:"exp_samples"`
	}
	in := make([]input, len(series))
	for i, s := range series {
		in[i] = input{Series: s, Values: "1+1x10"}
	}
	var tests []exprTest
	for _, n := range names {
		tests = append(tests, exprTest{Expr: "absent(" + n + ")", EvalTime: "10m", ExpSamples: []any{}})
	}
	write := func(name string, v any) string {
		b, err := json.MarshalIndent(v, "", " ")
		if err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	rulesFile := write("rules.json", map[string]any{"groups": []any{map[string]any{"name": "dashboard", "rules": rules}}})
	testFile := write("test.json", map[string]any{"rule_files": []string{rulesFile}, "evaluation_interval": "1m",
		"tests": []any{map[string]any{"interval": "1m", "input_series": in, "promql_expr_test": tests}}})
	if out, err := exec.Command(bin, "check", "rules", rulesFile).CombinedOutput(); err != nil {
		return string(out), fmt.Errorf("promtool check rules: %w", err)
	}
	out, err := exec.Command(bin, "test", "rules", testFile).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("promtool test rules: %w", err)
	}
	return string(out), nil
}

// Every PromQL expression of deploy/grafana/rl-tproxy.json is valid
// (promtool check rules) and names only metrics the binary really
// exports: a running binary's /metrics, after allowed and denied requests,
// is promtool's input, and absent(NAME) must be empty for every name. The
// same check fails for a dashboard naming a metric that does not exist.
func TestGrafanaDashboardQueries(t *testing.T) {
	bin := testkit.NeedTool(t, "promtool", "prometheus")
	raw, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	exprs := dashboardExprs(t, raw)
	if len(exprs) < 20 {
		t.Fatalf("%d expressions in %s: the walk missed panels", len(exprs), dashboardFile)
	}
	var names []string
	anyName := regexp.MustCompile(`\b(?:rl_tproxy|go|process)_[a-z0-9_]+`)
	for i, e := range exprs {
		exprs[i] = substituteVars(e)
		ns := metricNames(exprs[i])
		if len(ns) == 0 {
			t.Errorf("no metric in %q", e)
		}
		for _, raw := range anyName.FindAllString(promString.ReplaceAllString(exprs[i], `""`), -1) {
			if !slices.Contains(ns, raw) && !promMatchersHold(exprs[i], raw) {
				t.Errorf("metricNames(%q) missed %s", exprs[i], raw)
			}
		}
		for _, n := range ns {
			if !slices.Contains(names, n) {
				names = append(names, n)
			}
		}
	}
	sort.Strings(names)
	series, exported := scrapeSeries(runForScrape(t))
	for _, n := range names {
		if !exported[n] {
			t.Errorf("the dashboard uses %s, which the binary does not export", n)
		}
	}
	if out, err := promtoolRun(t, bin, exprs, names, series); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	// The check can fail: a metric that does not exist.
	bogus := append(slices.Clone(exprs), `sum(rate(rl_tproxy_no_such_metric_total[5m]))`)
	if out, err := promtoolRun(t, bin, bogus, append(slices.Clone(names), "rl_tproxy_no_such_metric_total"), series); err == nil {
		t.Fatalf("promtool accepted a dashboard naming rl_tproxy_no_such_metric_total:\n%s", out)
	}
	t.Logf("%d expressions, %d metric names, checked against %d exported series at %s", len(exprs), len(names), len(series), time.Now().Format(time.RFC3339))
}

// promMatchersHold reports whether name occurs only inside a label matcher
// or range of expr (then it is not a selected metric).
func promMatchersHold(expr, name string) bool {
	s := promMatchers.ReplaceAllString(expr, " ")
	s = promRange.ReplaceAllString(s, " ")
	return !strings.Contains(s, name)
}

// The dashboard imports cleanly: unique panel ids, panels that do not
// overlap on Grafana's 24-column grid, every query on the data source
// variable with a refId.
func TestGrafanaDashboardLayout(t *testing.T) {
	raw, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		UID    string `json:"uid"`
		Panels []struct {
			ID      int                      `json:"id"`
			Type    string                   `json:"type"`
			Title   string                   `json:"title"`
			GridPos struct{ H, W, X, Y int } `json:"gridPos"`
			Targets []struct {
				RefID      string `json:"refId"`
				Datasource struct {
					UID string `json:"uid"`
				} `json:"datasource"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(raw, &d); err != nil {
		t.Fatal(err)
	}
	if d.UID == "" || len(d.Panels) == 0 {
		t.Fatalf("uid %q, %d panels", d.UID, len(d.Panels))
	}
	ids := map[int]bool{}
	cells := map[[2]int]string{}
	for _, p := range d.Panels {
		if ids[p.ID] {
			t.Errorf("panel id %d repeated (%s)", p.ID, p.Title)
		}
		ids[p.ID] = true
		g := p.GridPos
		if g.W <= 0 || g.H <= 0 || g.X < 0 || g.X+g.W > 24 {
			t.Errorf("panel %q: gridPos %+v", p.Title, g)
		}
		for x := g.X; x < g.X+g.W; x++ {
			for y := g.Y; y < g.Y+g.H; y++ {
				if other, ok := cells[[2]int{x, y}]; ok {
					t.Fatalf("panels %q and %q overlap at %d,%d", other, p.Title, x, y)
				}
				cells[[2]int{x, y}] = p.Title
			}
		}
		if p.Type != "row" && len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, q := range p.Targets {
			if q.RefID == "" || q.Datasource.UID != "${datasource}" {
				t.Errorf("panel %q: query refId %q on data source %q", p.Title, q.RefID, q.Datasource.UID)
			}
		}
	}
}
