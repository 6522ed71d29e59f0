// Package bench checks the side-by-side benchmark charts: test/bench/charts.sh
// draws valid SVG from a results file, and the committed charts in
// docs/bench parse as XML, show the committed results and are referenced
// from docs/performance.md.
package bench

import (
	"bytes"
	"encoding/xml"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/rl-tproxy/rl-tproxy/internal/testkit"
)

var charts = []string{"sidebyside-throughput.svg", "sidebyside-cpu.svg", "sidebyside-latency.svg"}

// svgTexts parses an SVG document as XML and returns its root element's
// name and the character data of every <text> element.
func svgTexts(t *testing.T, path string) (string, []string) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	dec := xml.NewDecoder(f)
	var root string
	var texts []string
	depth := 0 // inside <text>
	var cur strings.Builder
	for {
		tok, err := dec.Token()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("%s is not well-formed XML: %v", path, err)
		}
		switch tok := tok.(type) {
		case xml.StartElement:
			if root == "" {
				root = tok.Name.Local
			}
			if tok.Name.Local == "text" {
				depth++
			}
		case xml.EndElement:
			if tok.Name.Local == "text" {
				depth--
				if depth == 0 {
					texts = append(texts, strings.TrimSpace(cur.String()))
					cur.Reset()
				}
			}
		case xml.CharData:
			if depth > 0 {
				cur.Write(tok)
			}
		}
	}
	return root, texts
}

func has(texts []string, s string) bool {
	for _, x := range texts {
		if strings.Contains(x, s) {
			return true
		}
	}
	return false
}

// setups returns the setup column of a results file.
func setups(t *testing.T, path string) []string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for i, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		if f := strings.Split(l, "\t"); i > 0 && len(f) == 6 {
			out = append(out, f[1])
		}
	}
	return out
}

// The committed charts are SVG documents of the committed results, and
// docs/performance.md shows each of them.
func TestCommittedCharts(t *testing.T) {
	dir := filepath.Join("..", "..", "docs", "bench")
	names := setups(t, filepath.Join(dir, "sidebyside.tsv"))
	if len(names) == 0 {
		t.Fatal("docs/bench/sidebyside.tsv has no rows")
	}
	perf, err := os.ReadFile(filepath.Join("..", "..", "docs", "performance.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range charts {
		root, texts := svgTexts(t, filepath.Join(dir, c))
		if root != "svg" {
			t.Errorf("%s: root element %q, want svg", c, root)
		}
		for _, n := range names {
			if !has(texts, n) {
				t.Errorf("%s has no label %q (stale against sidebyside.tsv?)", c, n)
			}
		}
		if !bytes.Contains(perf, []byte("(bench/"+c+")")) {
			t.Errorf("docs/performance.md does not show bench/%s", c)
		}
	}
}

// The committed .tsv holds the rows of the committed report: each setup
// with the same req/s as in docs/bench/sidebyside.md's table (run.sh
// writes both; a report regenerated without its .tsv is caught here).
func TestCommittedResultsMatchReport(t *testing.T) {
	dir := filepath.Join("..", "..", "docs", "bench")
	md, err := os.ReadFile(filepath.Join(dir, "sidebyside.md"))
	if err != nil {
		t.Fatal(err)
	}
	tsv, err := os.ReadFile(filepath.Join(dir, "sidebyside.tsv"))
	if err != nil {
		t.Fatal(err)
	}
	rows := 0
	for i, l := range strings.Split(strings.TrimSpace(string(tsv)), "\n") {
		f := strings.Split(l, "\t")
		if i == 0 {
			continue
		}
		if len(f) != 6 {
			t.Fatalf("sidebyside.tsv line %d: %d fields", i+1, len(f))
		}
		rows++
		if !bytes.Contains(md, []byte("| "+f[1]+" | "+f[2]+" |")) {
			t.Errorf("sidebyside.md has no row %q with %s req/s (sidebyside.tsv is stale: test/bench/charts.sh --from-md docs/bench/sidebyside.md rebuilds it and the charts)", f[1], f[2])
		}
	}
	if rows == 0 {
		t.Fatal("sidebyside.tsv has no rows")
	}
}

// charts.sh draws three SVG charts from a results file: bars with the
// values for measured columns, a note for a column measured for no
// setup; a file that is not a results file is refused.
func TestChartsScript(t *testing.T) {
	testkit.NeedTool(t, "gnuplot", "gnuplot-nox")
	dir := t.TempDir()
	results := filepath.Join(dir, "sidebyside.tsv")
	write := func(body string) {
		if err := os.WriteFile(results, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	run := func() ([]byte, error) {
		return exec.Command("./charts.sh", results, filepath.Join(dir, "out")).CombinedOutput()
	}
	const head = "row\tsetup\treq_s\tp50_ms\tp99_ms\tcpu_us_per_req\n"
	write(head + "proxy_pass\tnginx proxy_pass, upstream keepalive\t9175.64\t1.890\t369.890\t36.2\n" +
		"admission\trl-tproxy + admission (embedded RateLimitly)\t6421.06\t4.160\t34.640\t52.7\n")
	if out, err := run(); err != nil {
		t.Fatalf("charts.sh: %v\n%s", err, out)
	}
	want := map[string][]string{
		"sidebyside-throughput.svg": {"9176", "6421"},
		"sidebyside-cpu.svg":        {"36.2", "52.7"},
		"sidebyside-latency.svg":    {"1.89", "369.89", "4.16", "34.64", "p50", "p99"},
	}
	for _, c := range charts {
		root, texts := svgTexts(t, filepath.Join(dir, "out", c))
		if root != "svg" {
			t.Errorf("%s: root %q", c, root)
		}
		for _, w := range append(want[c], "nginx proxy_pass, upstream keepalive", "rl-tproxy + admission (embedded RateLimitly)") {
			if !has(texts, w) {
				t.Errorf("%s: no text %q in %q", c, w, texts)
			}
		}
		if has(texts, "not measured") {
			t.Errorf("%s says not measured", c)
		}
	}

	write(head + "a\tsetup a\t100\t1\t2\tNA\n")
	if out, err := run(); err != nil {
		t.Fatalf("charts.sh without CPU: %v\n%s", err, out)
	}
	if _, texts := svgTexts(t, filepath.Join(dir, "out", "sidebyside-cpu.svg")); !has(texts, "not measured in this run") {
		t.Errorf("CPU chart without CPU data: %q", texts)
	}

	// A report without its .tsv: --from-md rebuilds it from the table.
	md := filepath.Join(dir, "report.md")
	report := "# x\n\n| setup | req/s (median of 3) | p50 ms | p99 ms | req/s vs nginx proxy_pass | CPU µs/req | errors |\n" +
		"|---|---:|---:|---:|---:|---:|---:|\n| setup one | 100.5 | 1.000 | 2.000 | 1.00 | 12.5 | 0 |\n| setup two | 50.25 | 3.000 | 4.000 | 0.50 | 30.1 | 0 |\n\n" +
		"| setup (wrk -c1) | req/s |\n|---|---:|\n| other table | 1 |\n"
	if err := os.WriteFile(md, []byte(report), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("./charts.sh", "--from-md", md, filepath.Join(dir, "md")).CombinedOutput(); err != nil {
		t.Fatalf("charts.sh --from-md: %v\n%s", err, out)
	}
	got, err := os.ReadFile(filepath.Join(dir, "report.tsv"))
	if err != nil {
		t.Fatal(err)
	}
	if want := head + "row1\tsetup one\t100.5\t1.000\t2.000\t12.5\nrow2\tsetup two\t50.25\t3.000\t4.000\t30.1\n"; string(got) != want {
		t.Errorf("--from-md wrote\n%q\nwant\n%q", got, want)
	}
	if _, texts := svgTexts(t, filepath.Join(dir, "md", "sidebyside-cpu.svg")); !has(texts, "30.1") || !has(texts, "setup two") {
		t.Errorf("CPU chart from the report: %q", texts)
	}

	for _, bad := range []string{"", "row\tsetup\treq_s\n", head} {
		write(bad)
		if out, err := run(); err == nil {
			t.Errorf("charts.sh accepted %q:\n%s", bad, out)
		}
	}
}
