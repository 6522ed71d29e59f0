package hook

import (
	"fmt"
	"sort"
	"strings"
	"testing"

	"github.com/rl-tproxy/rl-tproxy/pkg/admission"
)

// prunePolicy has services web and (when other) other, with n limited
// locations named prefix0..prefix(n-1) in web, each limited by zone z
// and guarded by tracker tr, denying with status or status+1.
func prunePolicy(t *testing.T, prefix, zone, tracker string, n, status int, other bool) *admission.Policy {
	t.Helper()
	var b strings.Builder
	fmt.Fprintf(&b, "ratelimitly: {embedded: true}\nzones:\n  %s: {bucket: \"k:{remote_addr}\", rate: 10/s}\n", zone)
	fmt.Fprintf(&b, "trackers:\n  %s: {service: \"s\"}\nservices:\n", tracker)
	fmt.Fprintf(&b, "  - name: web\n    listen: 127.0.0.1:1\n    upstream: 127.0.0.1:2\n    locations:\n")
	for i := 0; i < n; i++ {
		fmt.Fprintf(&b, "      - {name: %s%d, match: {path_prefix: /%s%d/}, limit: [%s], guard: [{tracker: %s, threshold: 10ms}], deny: {status: %d}}\n",
			prefix, i, prefix, i, zone, tracker, status+i%2)
	}
	if other {
		fmt.Fprintf(&b, "  - name: other\n    listen: 127.0.0.1:3\n    upstream: 127.0.0.1:4\n    limit: [%s]\n", zone)
	}
	p, err := admission.Parse("policy.yaml", []byte(b.String()))
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// seriesOf lists the rl_tproxy series that carry a service label, as
// "name{labels}".
func seriesOf(t *testing.T, g *Gate) []string {
	t.Helper()
	fams, err := g.Metrics().Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, f := range fams {
		for _, m := range f.GetMetric() {
			var ls []string
			svc := false
			for _, l := range m.GetLabel() {
				ls = append(ls, l.GetName()+"="+l.GetValue())
				svc = svc || l.GetName() == "service"
			}
			if svc {
				out = append(out, f.GetName()+"{"+strings.Join(ls, ",")+"}")
			}
		}
	}
	sort.Strings(out)
	return out
}

// A reload deletes the series of the services, locations, zones, guards
// and deny statuses it removed: a policy, then the same renamed, then the
// original again leave exactly the original's series, not three
// policies' worth.
func TestSwapPrunesRemovedSeries(t *testing.T) {
	g := New(Config{})
	g.Swap(prunePolicy(t, "a", "za", "ta", 20, 429, true))
	g.Metrics().Connection("other", "tls", "relayed").Inc()
	first := seriesOf(t, g)
	if !strings.Contains(strings.Join(first, "\n"), "location=a19") {
		t.Fatalf("no series of location a19 after the first load:\n%s", strings.Join(first, "\n"))
	}

	g.Swap(prunePolicy(t, "b", "zb", "tb", 10, 431, false))
	renamed := seriesOf(t, g)
	for _, s := range renamed {
		for _, gone := range []string{"location=a", "name=za", "name=ta", "service=other", "status=430"} {
			if strings.Contains(s, gone) {
				t.Errorf("series of a removed %q left: %s", gone, s)
			}
		}
	}

	g.Swap(prunePolicy(t, "a", "za", "ta", 20, 429, true))
	g.Metrics().Connection("other", "tls", "relayed").Inc() // as the first round had it
	again := seriesOf(t, g)
	if strings.Join(again, "\n") != strings.Join(first, "\n") {
		t.Errorf("series after reloading the original: %d, want the original's %d", len(again), len(first))
	}
}
