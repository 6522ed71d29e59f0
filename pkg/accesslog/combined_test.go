package accesslog

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/rl-tproxy/rl-tproxy/internal/testkit"
)

// goaccessCombined is GoAccess's COMBINED log-format
// (`%h %^[%d:%t %^] "%r" %s %b "%R" "%u"`) as a regular expression; like
// GoAccess, it ignores what follows the user agent.
var goaccessCombined = regexp.MustCompile(`^(\S+) \S+ \S+ \[(\d{2}/[A-Z][a-z]{2}/\d{4}):(\d{2}:\d{2}:\d{2}) [+-]\d{4}\] "((?:[^"\\]|\\.)*)" (\d{3}) (\d+|-) "((?:[^"\\]|\\.)*)" "((?:[^"\\]|\\.)*)"(.*)$`)

var when = time.Date(2026, 12, 1, 3, 10, 0, 0, time.FixedZone("", 3600))

func record(attrs ...slog.Attr) slog.Record {
	r := slog.NewRecord(when, slog.LevelInfo, Message, 0)
	r.AddAttrs(attrs...)
	return r
}

func format(t *testing.T, h slog.Handler, r slog.Record) string {
	t.Helper()
	var b bytes.Buffer
	c := NewCombined(&b, nil)
	var hh slog.Handler = c
	if h != nil {
		hh = h
	}
	if err := hh.Handle(context.Background(), r); err != nil {
		t.Fatal(err)
	}
	return b.String()
}

func TestCombinedLayout(t *testing.T) {
	for _, c := range []struct {
		name  string
		attrs []slog.Attr
		want  string
	}{
		{"deny", []slog.Attr{slog.String("service", "web"), slog.String(Remote, "10.0.0.7:4321"), slog.String(Method, "GET"),
			slog.String(Path, "/api/a"), slog.String(Query, "x=1"), slog.String(Proto, "http/1.1"), slog.Int(Status, 429),
			slog.String("deny_zones", "per_client"), slog.Uint64("retry_after", 3), slog.Float64("admission_ms", 0.25),
			slog.Int64(BytesOut, 262), slog.Bool("report", false), slog.String(UserAgent, "curl/7.88.1"), slog.String("request_id", "abc")},
			`10.0.0.7 - - [01/Dec/2026:03:10:00 +0100] "GET /api/a?x=1 HTTP/1.1" 429 262 "-" "curl/7.88.1" service=web deny_zones=per_client retry_after=3 admission_ms=0.25 report=false request_id=abc` + "\n"},
		{"v6, h2, quoting", []slog.Attr{slog.String(Remote, "[::1]:80"), slog.String(Method, "POST"), slog.String(Path, "/"),
			slog.String(Proto, "h2"), slog.Int(Status, 200), slog.Int64(BytesOut, 5), slog.String(Referer, `http://x/"q"`),
			slog.String(UserAgent, "a\\b\x01"), slog.String("upstream_error", `read: "eof" x=1`), slog.String("empty", "")},
			`::1 - - [01/Dec/2026:03:10:00 +0100] "POST / HTTP/2.0" 200 5 "http://x/\x22q\x22" "a\x5Cb\x01" upstream_error="read: \x22eof\x22 x=1" empty=""` + "\n"},
		{"nothing known", nil, `- - - [01/Dec/2026:03:10:00 +0100] "-" 499 - "-" "-"` + "\n"},
		{"nothing sent", []slog.Attr{slog.Int(Status, 0)}, `- - - [01/Dec/2026:03:10:00 +0100] "-" 499 - "-" "-"` + "\n"},
	} {
		t.Run(c.name, func(t *testing.T) {
			got := format(t, nil, record(c.attrs...))
			if got != c.want {
				t.Fatalf("got\n%s\nwant\n%s", got, c.want)
			}
			if !goaccessCombined.MatchString(strings.TrimSuffix(got, "\n")) {
				t.Fatalf("GoAccess COMBINED does not parse %q", got)
			}
		})
	}
}

// Non-access records (operational logs) stay slog text; attributes and
// groups added with With reach both layouts.
func TestCombinedOtherRecordsAndWith(t *testing.T) {
	var b bytes.Buffer
	h := NewCombined(&b, &slog.HandlerOptions{Level: slog.LevelInfo})
	log := slog.New(h).With("node", "n1")
	log.Debug("hidden")
	log.Info("policy reloaded", "generation", 2)
	log.WithGroup("g").Info(Message, Status, 200, "k", "v")
	lines := strings.Split(strings.TrimSuffix(b.String(), "\n"), "\n")
	if len(lines) != 2 {
		t.Fatalf("lines %q", lines)
	}
	if !strings.Contains(lines[0], `msg="policy reloaded" node=n1 generation=2`) {
		t.Errorf("text line %q", lines[0])
	}
	// Inside a group, status is an extra field, not the status column.
	if !strings.HasPrefix(lines[1], "- - - [") || !strings.HasSuffix(lines[1], `] "-" 499 - "-" "-" node=n1 g.status=200 g.k=v`) {
		t.Errorf("combined line %q", lines[1])
	}
}

// Whatever a client puts in its request fields, the line keeps its
// columns: the regex finds the status and the user agent in place.
func FuzzCombinedColumns(f *testing.F) {
	f.Add("GET", "/a", "x=1", "curl/8", "http://r/")
	f.Add("GET", `/a" 200 1 "x`, "", `" 500 0 "-" "evil`, "\\")
	f.Add("", "", "", "\n\r\x00", "\xff")
	f.Fuzz(func(t *testing.T, method, path, query, ua, ref string) {
		line := format(t, nil, record(slog.String(Remote, "1.2.3.4:5"), slog.String(Method, method), slog.String(Path, path),
			slog.String(Query, query), slog.Int(Status, 418), slog.Int64(BytesOut, 9), slog.String(UserAgent, ua),
			slog.String(Referer, ref), slog.String("x", ua)))
		if strings.Count(line, "\n") != 1 {
			t.Fatalf("not one line: %q", line)
		}
		m := goaccessCombined.FindStringSubmatch(strings.TrimSuffix(line, "\n"))
		if m == nil || m[1] != "1.2.3.4" || m[5] != "418" || m[6] != "9" {
			t.Fatalf("columns lost in %q: %q", line, m)
		}
		if want := string(appendEscaped(nil, orDash(ua))); m[8] != want {
			t.Fatalf("user agent %q, want %q", m[8], want)
		}
	})
}

// GoAccess itself reads the lines as COMBINED: every request valid, the
// statuses and bytes counted.
func TestGoAccessReadsCombined(t *testing.T) {
	ga := testkit.NeedTool(t, "goaccess", "goaccess")
	var b bytes.Buffer
	log := slog.New(NewCombined(&b, nil))
	log.Info(Message, Remote, "127.0.0.1:1", Method, "GET", Path, "/api/a", Query, "x=1", Proto, "http/1.1", Status, 429,
		"deny_zones", "per_client", "retry_after", 3, BytesOut, 262, UserAgent, "curl/7.88.1", "request_id", "abc")
	log.Info(Message, Remote, "[2001:db8::1]:2", Method, "GET", Path, "/api/b", Proto, "http/1.0", Status, 200,
		"upstream", "127.0.0.1:8081", "upstream_status", 200, BytesOut, 751, UserAgent, `Mozilla "quoted"`, Referer, "http://r/")
	dir := t.TempDir()
	logf, out := filepath.Join(dir, "access.log"), filepath.Join(dir, "report.json")
	if err := os.WriteFile(logf, b.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(ga, logf, "--log-format=COMBINED", "--no-global-config", "-o", out)
	if msg, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("goaccess: %v\n%s", err, msg)
	}
	raw, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	var rep struct {
		General struct {
			Total     int `json:"total_requests"`
			Valid     int `json:"valid_requests"`
			Failed    int `json:"failed_requests"`
			Bandwidth int `json:"bandwidth"`
		} `json:"general"`
		Requests struct {
			Data []struct {
				Data string `json:"data"`
			} `json:"data"`
		} `json:"requests"`
	}
	if err := json.Unmarshal(raw, &rep); err != nil {
		t.Fatalf("report: %v", err)
	}
	g := rep.General
	if g.Total != 2 || g.Valid != 2 || g.Failed != 0 || g.Bandwidth != 262+751 {
		t.Fatalf("goaccess counted %+v for\n%s", g, b.String())
	}
	paths := map[string]bool{}
	for _, d := range rep.Requests.Data {
		paths[d.Data] = true
	}
	if !paths["/api/a?x=1"] || !paths["/api/b"] {
		t.Fatalf("goaccess requests %v", paths)
	}
}
