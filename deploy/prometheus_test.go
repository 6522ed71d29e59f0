package deploy

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/rl-tproxy/rl-tproxy/internal/testkit"
)

func promtool(t *testing.T) string {
	t.Helper()
	return testkit.NeedTool(t, "promtool", "prometheus")
}

// The alert rules load and behave as their promtool unit tests say.
func TestPrometheusAlertRules(t *testing.T) {
	bin := promtool(t)
	for _, args := range [][]string{{"check", "rules", "alerts.yaml"}, {"test", "rules", "alerts_test.yaml"}} {
		cmd := exec.Command(bin, args...)
		cmd.Dir = "prometheus"
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
}

// The scrape configuration is valid. Debian's promtool is built without
// Kubernetes service discovery; there the kubernetes_sd_configs block is
// swapped for an empty static_configs so the relabelling rules and the
// rest of the file are still checked, and the swap is logged.
func TestPrometheusScrapeConfig(t *testing.T) {
	bin := promtool(t)
	check := func(dir string) (string, error) {
		out, err := exec.Command(bin, "check", "config", filepath.Join(dir, "prometheus.yaml")).CombinedOutput()
		return string(out), err
	}
	out, err := check("prometheus")
	if err == nil {
		return
	}
	if !strings.Contains(out, "field kubernetes_sd_configs not found") {
		t.Fatalf("promtool check config: %v\n%s", err, out)
	}
	t.Log("this promtool has no Kubernetes service discovery; checking the rest of the file")
	cfg := readFile(t, "prometheus/prometheus.yaml")
	sd := "    kubernetes_sd_configs:\n      - role: pod\n        namespaces:\n          names: [rl-tproxy]\n"
	if !strings.Contains(cfg, sd) {
		t.Fatal("prometheus.yaml's kubernetes_sd_configs block changed shape; update this test")
	}
	dir := t.TempDir()
	for name, body := range map[string]string{
		"prometheus.yaml": strings.Replace(cfg, sd, "    static_configs:\n      - targets: []\n", 1),
		"alerts.yaml":     readFile(t, "prometheus/alerts.yaml"),
	} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if out, err := check(dir); err != nil {
		t.Fatalf("promtool check config: %v\n%s", err, out)
	}
	// And the check can fail: a broken relabel regex.
	broken := strings.Replace(cfg, sd, "    static_configs:\n      - targets: []\n", 1)
	broken = strings.Replace(broken, `regex: (.+);(\d+)`, `regex: (.+;(\d+)`, 1)
	if err := os.WriteFile(filepath.Join(dir, "prometheus.yaml"), []byte(broken), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := check(dir); err == nil {
		t.Fatal("promtool accepted a broken relabel regex")
	}
}

// The scrape job reads exactly the annotations and port the DaemonSet sets.
func TestPrometheusJobMatchesDaemonSet(t *testing.T) {
	cfg := readFile(t, "prometheus/prometheus.yaml")
	for _, want := range []string{
		"__meta_kubernetes_pod_annotation_prometheus_io_scrape",
		"__meta_kubernetes_pod_annotation_prometheus_io_port",
		"__meta_kubernetes_pod_annotation_prometheus_io_path",
		"names: [rl-tproxy]",
		`"127.0.0.1:9901"`,
	} {
		if !strings.Contains(cfg, want) {
			t.Errorf("prometheus.yaml lacks %s", want)
		}
	}
}

// Every rl_tproxy_* family the alerts and docs/operations.md use is one
// docs/metrics.md documents (the metrics package tests that page against
// the registry), so a renamed metric fails here, not silently in
// production.
func TestAlertMetricsDocumented(t *testing.T) {
	metricsDoc := readFile(t, "../docs/metrics.md")
	re := regexp.MustCompile(`rl_tproxy_[a-z0-9_]+`)
	for _, file := range []string{"prometheus/alerts.yaml", "../docs/operations.md"} {
		for _, name := range re.FindAllString(readFile(t, file), -1) {
			family := name
			for _, suffix := range []string{"_bucket", "_sum", "_count"} {
				family = strings.TrimSuffix(family, suffix)
			}
			if !strings.Contains(metricsDoc, "`"+family+"`") {
				t.Errorf("%s uses %s, which docs/metrics.md does not list", file, name)
			}
		}
	}
}
