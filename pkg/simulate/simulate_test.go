package simulate

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rl-tproxy/rl-tproxy/pkg/accesslog"
	"github.com/rl-tproxy/rl-tproxy/pkg/admission"
)

var t0 = time.Date(2026, 12, 1, 3, 40, 11, 0, time.UTC)

// line is one request as the proxy logs it.
type line struct {
	at                                       time.Duration
	remote, path, query, loc, outcome, cause string
	status                                   int
	durMs                                    float64
}

// writeLog writes ls through the product's own handlers: slog's JSON
// handler (--log-format json) or pkg/accesslog (--log-format combined),
// with the attributes pkg/hook logs.
func writeLog(t testing.TB, format string, ls []line) []byte {
	t.Helper()
	var buf bytes.Buffer
	var h slog.Handler
	if format == FormatCombined {
		h = accesslog.NewCombined(&buf, nil)
	} else {
		h = slog.NewJSONHandler(&buf, nil)
	}
	// a non-access line first, as a real log has
	if err := h.Handle(context.Background(), slog.NewRecord(t0, slog.LevelInfo, "listening", 0)); err != nil {
		t.Fatal(err)
	}
	for _, l := range ls {
		rec := slog.NewRecord(t0.Add(l.at), slog.LevelInfo, accesslog.Message, 0)
		rec.AddAttrs(slog.String("service", "web"), slog.String("location", l.loc),
			slog.String(accesslog.Remote, l.remote), slog.String(accesslog.Method, "GET"),
			slog.String("host", "shop.example"), slog.String(accesslog.Path, l.path))
		if l.query != "" {
			rec.AddAttrs(slog.String(accesslog.Query, l.query))
		}
		rec.AddAttrs(slog.String(accesslog.Proto, "http/1.1"), slog.Int(accesslog.Status, l.status),
			slog.String("verdict", "allow"), slog.String("outcome", l.outcome), slog.String("cause", l.cause),
			slog.Float64("admission_ms", 0.4), slog.Float64("duration_ms", l.durMs),
			slog.Int64("bytes_in", 0), slog.Int64(accesslog.BytesOut, 120), slog.Bool("report", true),
			slog.String(accesslog.UserAgent, "curl/8 \"quoted\""), slog.Uint64("generation", 1))
		if err := h.Handle(context.Background(), rec); err != nil {
			t.Fatal(err)
		}
	}
	return buf.Bytes()
}

func writePolicy(t testing.TB, body string) *admission.Policy {
	t.Helper()
	path := filepath.Join(t.TempDir(), "policy.yaml")
	if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	p, err := admission.LoadOffline(path)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

const burst3Policy = `ratelimitly:
  srv: _rl._udp.example.internal
  credentials: /nonexistent/credentials.yaml
zones:
  per_client: {bucket: "c:{remote_addr}", rate: 1/m, burst: 3}
  per_user: {bucket: "u:{query.user}", rate: 1/m, burst: 3}
trackers:
  slow: {service: "slow:{host}"}
services:
  - name: web
    listen: 127.0.0.1:8080
    upstream: 127.0.0.1:8081
    locations:
      - name: health
        match: {path: /healthz}
      - name: search
        match: {path_prefix: /search}
        limit: [per_user]
      - name: checkout
        match: {path_prefix: /checkout}
        guard: [{tracker: slow, threshold: 100ms}]
        report: slow
      - name: api
        match: {path_prefix: /api}
        limit: [per_client]
`

// The example: 20 recorded requests of 2 keys, all admitted under
// the old policy; with burst 3 the new one admits 3 per key and denies
// 14, all in location api, in both log formats.
func TestTwentyRequestsBurstThree(t *testing.T) {
	for _, format := range []string{FormatJSON, FormatCombined} {
		t.Run(format, func(t *testing.T) {
			var ls []line
			for i := range 20 {
				ip := []string{"10.0.0.1", "10.0.0.2"}[i%2]
				ls = append(ls, line{at: time.Duration(i) * 100 * time.Millisecond, remote: ip + ":4000", path: "/api/items",
					loc: "api", outcome: "allow", cause: "allow", status: 200, durMs: 3})
			}
			ls = append(ls, line{at: 2 * time.Second, remote: "10.0.0.9:1", path: "/healthz", loc: "health", outcome: "bypass", cause: "unprotected", status: 200})
			s, err := New(writePolicy(t, burst3Policy), Options{Format: format})
			if err != nil {
				t.Fatal(err)
			}
			res, err := s.Run(bytes.NewReader(writeLog(t, format, ls)))
			if err != nil {
				t.Fatal(err)
			}
			if res.Lines != 22 || res.Replayed != 21 || res.NotAccess != 1 || res.Malformed != 0 {
				t.Fatalf("lines %d replayed %d other %d malformed %d", res.Lines, res.Replayed, res.NotAccess, res.Malformed)
			}
			api := find(t, res, "api")
			if api.Requests != 20 || api.WouldAllow != 6 || api.WouldDeny != 14 || api.DenyRecordedAdmitted != 14 || api.RecordedAdmitted != 20 {
				t.Fatalf("api: %+v", api)
			}
			// The first deny is the 7th request (the 4th of the first key).
			if want := t0.Add(600 * time.Millisecond); format == FormatJSON && !api.FirstDeny.Equal(want) {
				t.Errorf("first deny %v, want %v", api.FirstDeny, want)
			}
			z := api.Zones[0]
			if z.Zone != "per_client" || z.WouldDeny != 14 || len(z.TopKeys) != 2 || z.TopKeys[0].Denies != 7 || z.TopKeys[1].Denies != 7 {
				t.Fatalf("zone: %+v", z)
			}
			if z.TopKeys[0].Key != "c:10.0.0.1" || z.TopKeys[1].Key != "c:10.0.0.2" {
				t.Errorf("keys %+v", z.TopKeys)
			}
			if h := find(t, res, "health"); h.Requests != 1 || h.WouldDeny != 0 || h.Outcomes["bypass"] != 1 {
				t.Errorf("health: %+v", h)
			}
			var out bytes.Buffer
			if err := WriteText(&out, res, time.Second); err != nil {
				t.Fatal(err)
			}
			for _, want := range []string{"service web location api: 20 requests, would allow 6, would deny 14", `"c:10.0.0.1" 7`, "would deny 14 that were admitted"} {
				if !strings.Contains(out.String(), want) {
					t.Errorf("text lacks %q:\n%s", want, out.String())
				}
			}
		})
	}
}

func find(t *testing.T, res *Result, loc string) LocationResult {
	t.Helper()
	for _, l := range res.Locations {
		if l.Location == loc {
			return l
		}
	}
	t.Fatalf("no location %s in %+v", loc, res.Locations)
	return LocationResult{}
}

// Virtual time: the same 4 requests of one key spread over 3 minutes
// refill the 1/m bucket and are all admitted; within one second the 4th
// is denied. Query keys are rendered from the logged query.
func TestVirtualTimeRefills(t *testing.T) {
	for _, tc := range []struct {
		gap  time.Duration
		deny int64
	}{{time.Minute, 0}, {time.Millisecond, 1}} {
		var ls []line
		for i := range 4 {
			ls = append(ls, line{at: time.Duration(i) * tc.gap, remote: "10.0.0.1:1", path: "/search", query: "user=eve&x=1", loc: "search", outcome: "allow", cause: "allow", status: 200})
		}
		s, _ := New(writePolicy(t, burst3Policy), Options{})
		res, err := s.Run(bytes.NewReader(writeLog(t, FormatJSON, ls)))
		if err != nil {
			t.Fatal(err)
		}
		l := find(t, res, "search")
		if l.WouldDeny != tc.deny || (tc.deny > 0 && l.Zones[0].TopKeys[0].Key != "u:eve") {
			t.Errorf("gap %v: %+v", tc.gap, l)
		}
	}
}

// Guards are fed by the logged durations of admitted requests: slow
// checkouts trip the guard, and later checkouts would be denied.
func TestGuardsFromLoggedDurations(t *testing.T) {
	var ls []line
	for i := range 30 {
		ls = append(ls, line{at: time.Duration(i) * 100 * time.Millisecond, remote: "10.0.0.1:1", path: "/checkout", loc: "checkout", outcome: "allow", cause: "allow", status: 200, durMs: 900})
	}
	s, _ := New(writePolicy(t, burst3Policy), Options{})
	res, err := s.Run(bytes.NewReader(writeLog(t, FormatJSON, ls)))
	if err != nil {
		t.Fatal(err)
	}
	l := find(t, res, "checkout")
	// The first request passes (no data), every later one sees p90 900ms.
	if l.WouldDeny != 29 || l.Guards[0].WouldDeny != 29 || l.Causes["deny_guard"] != 29 {
		t.Fatalf("%+v", l)
	}
}

// Templates and conditions the log cannot supply are named up front.
func TestUnreplayableWarnings(t *testing.T) {
	p := writePolicy(t, `ratelimitly: {embedded: true}
zones:
  k: {bucket: "{header.x-api-key}{cookie.s}{header.user-agent}", rate: 1/s}
  port: {bucket: "{remote_port}{server_port}", rate: 1/s}
services:
  - name: web
    listen: 127.0.0.1:8080
    upstream: 127.0.0.1:8081
    locations:
      - name: a
        match: {headers: {x-beta: present}}
        limit: [k, port]
`)
	got := strings.Join(Unreplayable(p, FormatCombined), "\n")
	for _, want := range []string{"zone k uses header.x-api-key", "zone k uses cookie.s", "zone port uses remote_port", "zone port uses server_port", "location a match uses header.x-beta"} {
		if !strings.Contains(got, want) {
			t.Errorf("warnings lack %q:\n%s", want, got)
		}
	}
	if strings.Contains(got, "user-agent") || strings.Contains(strings.Join(Unreplayable(p, FormatJSON), "\n"), "remote_port") {
		t.Errorf("a carried variable reported:\n%s", got)
	}
}

// Hostile input: malformed and oversized lines are counted and skipped,
// a huge number of lines of garbage does not stop the replay, and the
// lines after them are replayed.
func TestAbuseLines(t *testing.T) {
	good := writeLog(t, FormatJSON, []line{{remote: "10.0.0.1:1", path: "/api/x", loc: "api", outcome: "allow", cause: "allow", status: 200}})
	var in bytes.Buffer
	in.WriteString("not json at all\n")
	in.WriteString(`{"msg":"access","time":"yesterday"}` + "\n")
	in.WriteString(`{"msg":"access","time":"2026-12-01T03:40:11Z","path":"/api` + "\x00" + `"}` + "\n")
	in.WriteString(`{"msg":"access","time":"2026-12-01T03:40:11Z","nested":{"a":[1,{"b":"c"}]},"path":"/api/\u0078"}` + "\n")
	in.WriteString(strings.Repeat("{", 5000) + "\n")
	in.WriteString(`{"msg":"access","time":"2026-12-01T03:40:11Z","path":"/api/` + strings.Repeat("a", 2*MaxLine) + `"}` + "\n")
	in.WriteString("\n\r\n")
	in.Write(good)
	in.WriteString(`{"msg":"access"`) // cut off at the end
	s, _ := New(writePolicy(t, burst3Policy), Options{})
	res, err := s.Run(&in)
	if err != nil {
		t.Fatal(err)
	}
	// malformed: lines 1, 2, 3, 5, the two empty ones and the cut one
	if res.Lines != 11 || res.Oversized != 1 || res.Replayed != 2 || res.Malformed != 7 || res.FirstMalformed != 1 || res.NotAccess != 1 {
		t.Fatalf("%+v", res)
	}
	if l := find(t, res, "api"); l.Requests != 1 { // the nested line names no service
		t.Fatalf("api %+v", l)
	}
}

// A log replaced (renamed over) while it is read: the replay keeps
// reading the file it opened, to its end, and counts what it read.
func TestLogReplacedMidRead(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "access.log")
	var ls []line
	for i := range 2000 {
		ls = append(ls, line{at: time.Duration(i) * time.Millisecond, remote: fmt.Sprintf("10.0.%d.%d:1", i/256%256, i%256), path: "/api/x", loc: "api", outcome: "allow", cause: "allow", status: 200})
	}
	if err := os.WriteFile(path, writeLog(t, FormatJSON, ls), 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	replaced := false
	r := readerFunc(func(p []byte) (int, error) {
		n, err := f.Read(p[:min(len(p), 4096)])
		if !replaced {
			replaced = true
			other := filepath.Join(dir, "new.log")
			if err := os.WriteFile(other, []byte("garbage\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			if err := os.Rename(other, path); err != nil {
				t.Fatal(err)
			}
		}
		return n, err
	})
	s, _ := New(writePolicy(t, burst3Policy), Options{})
	res, err := s.Run(r)
	if err != nil {
		t.Fatal(err)
	}
	if !replaced || res.Replayed != 2000 || res.Malformed != 0 {
		t.Fatalf("replaced %v: %+v", replaced, res)
	}
}

type readerFunc func([]byte) (int, error)

func (f readerFunc) Read(p []byte) (int, error) { return f(p) }

// A read error ends the replay with the error and the partial result.
func TestReadError(t *testing.T) {
	s, _ := New(writePolicy(t, burst3Policy), Options{})
	boom := fmt.Errorf("disk on fire")
	res, err := s.Run(readerFunc(func([]byte) (int, error) { return 0, boom }))
	if err == nil || !strings.Contains(err.Error(), "disk on fire") || res == nil {
		t.Fatalf("%v %v", res, err)
	}
	if _, err := New(writePolicy(t, burst3Policy), Options{Format: "xml"}); err == nil {
		t.Fatal("format xml accepted")
	}
}

// Tiers are looked up per request from what the log carries: a plan in
// the query gives free users 2 requests and pro users 10.
func TestTiersFromQuery(t *testing.T) {
	p := writePolicy(t, `ratelimitly: {embedded: true}
tiers:
  plan:
    key: "{query.plan}"
    values: {free: 2/m, pro: 10/m}
    default: 2/m
zones:
  per_user: {bucket: "u:{query.user}", rate: {tier: plan}}
services:
  - name: web
    listen: 127.0.0.1:8080
    upstream: 127.0.0.1:8081
    locations:
      - name: api
        match: {path_prefix: /}
        limit: [per_user]
`)
	var ls []line
	for i := range 10 {
		ls = append(ls, line{at: time.Duration(i) * time.Millisecond, remote: "10.0.0.1:1", path: "/x", query: "user=f&plan=free", loc: "api", outcome: "allow", cause: "allow", status: 200})
		ls = append(ls, line{at: time.Duration(i) * time.Millisecond, remote: "10.0.0.2:1", path: "/x", query: "user=p&plan=pro", loc: "api", outcome: "allow", cause: "allow", status: 200})
	}
	s, err := New(p, Options{})
	if err != nil {
		t.Fatal(err)
	}
	res, err := s.Run(bytes.NewReader(writeLog(t, FormatJSON, ls)))
	if err != nil {
		t.Fatal(err)
	}
	l := find(t, res, "api")
	if l.WouldDeny != 8 || len(l.Zones[0].TopKeys) != 1 || l.Zones[0].TopKeys[0].Key != "u:f" {
		t.Fatalf("%+v", l)
	}
}
