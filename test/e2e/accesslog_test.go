package e2e

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rl-tproxy/rl-tproxy/internal/testkit"
)

// idUpstream is an upstream that records the X-Request-ID and traceparent
// fields of every request it gets.
type idUpstream struct {
	addr string
	mu   sync.Mutex
	seen []http.Header
}

func startIDUpstream(t *testing.T) *idUpstream {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	u := &idUpstream{addr: ln.Addr().String()}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u.mu.Lock()
		u.seen = append(u.seen, r.Header.Clone())
		u.mu.Unlock()
		fmt.Fprintf(w, "upstream %s\n", r.URL.Path)
	})}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { srv.Close() })
	return u
}

func (u *idUpstream) requests() []http.Header {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]http.Header(nil), u.seen...)
}

// accessByID waits for the access line with request_id id.
func (p *proxyProc) accessByID(id string) map[string]any {
	p.t.Helper()
	var line map[string]any
	testkit.WaitFor(p.t, "access line with request_id "+id, func() bool {
		for _, l := range p.access() {
			if l["request_id"] == id {
				line = l
				return true
			}
		}
		return false
	})
	return line
}

var generatedRequestID = regexp.MustCompile(`^[0-9a-f]{32}$`)

// The real binary, a RateLimitly cluster found through DNS SRV and curl:
// a denied request's access line names the zone and the Retry-After sent;
// an allowed request's line has the upstream, its status and time to the
// response head; one request id is in the access line, in the request the
// upstream received and in the deny answer. A client's valid id is kept,
// a missing one generated; traceparent reaches the upstream untouched.
func TestAccessLineAndRequestID(t *testing.T) {
	c := startCluster(t)
	up := startIDUpstream(t)
	dir := t.TempDir()
	o := policyOpts{fail: "close", credentials: writeCredentials(t, dir, c.cred), upstream: up.addr, listen: freeAddr(t), burst: 1}
	p := startProxy(t, writePolicy(t, dir, c, o), true)
	const tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"

	// 1. Allowed, with the client's id: the upstream sees it, and traceparent.
	r := curl(t, "-H", "X-Key: carol", "-H", "X-Request-ID: e2e-carol-1", "-H", "traceparent: "+tp, p.base+"/api/a")
	if r.status != 200 {
		t.Fatalf("first request: %d %s", r.status, r.body)
	}
	seen := up.requests()
	if len(seen) != 1 || seen[0].Values("X-Request-Id")[0] != "e2e-carol-1" || len(seen[0].Values("X-Request-Id")) != 1 ||
		seen[0].Get("Traceparent") != tp {
		t.Fatalf("upstream saw %v, want X-Request-ID e2e-carol-1 and the traceparent", seen)
	}
	l := p.accessByID("e2e-carol-1")
	if l["outcome"] != "allow" || l["upstream"] != up.addr || l["upstream_status"] != float64(200) || l["traceparent"] != tp || l["proto"] != "http/1.1" {
		t.Fatalf("allowed request's access line %v", l)
	}
	if ttfb, ok := l["upstream_ttfb_ms"].(float64); !ok || ttfb <= 0 || ttfb > l["duration_ms"].(float64) {
		t.Fatalf("upstream_ttfb_ms %v (duration_ms %v)", l["upstream_ttfb_ms"], l["duration_ms"])
	}

	// 2. Denied, same id: the answer carries it, the line names the zone
	// and the Retry-After that was sent; the upstream never sees it.
	r = curl(t, "-H", "X-Key: carol", "-H", "X-Request-ID: e2e-carol-1", p.base+"/api/a")
	if r.status != 429 || r.header.Get("X-Request-ID") != "e2e-carol-1" {
		t.Fatalf("second request: %d, X-Request-ID %q", r.status, r.header.Get("X-Request-ID"))
	}
	retry, err := strconv.Atoi(r.header.Get("Retry-After"))
	if err != nil || retry < 1 {
		t.Fatalf("Retry-After %q", r.header.Get("Retry-After"))
	}
	var deny map[string]any
	testkit.WaitFor(t, "the deny's access line", func() bool {
		for _, l := range p.access() {
			if l["request_id"] == "e2e-carol-1" && l["status"] == float64(429) {
				deny = l
				return true
			}
		}
		return false
	})
	if deny["deny_zones"] != "strict" || deny["retry_after"] != float64(retry) || deny["cause"] != "deny_resource" {
		t.Fatalf("denied request's access line %v, want deny_zones strict and retry_after %d", deny, retry)
	}
	if _, ok := deny["upstream"]; ok {
		t.Fatalf("denied request's access line names an upstream: %v", deny)
	}

	// 3. No id: the proxy generates one; the upstream, the line (allow),
	// and the answer and the line (deny) carry it.
	r = curl(t, "-H", "X-Key: dave", p.base+"/api/b")
	if r.status != 200 {
		t.Fatalf("third request: %d", r.status)
	}
	seen = up.requests()
	gen := seen[len(seen)-1].Get("X-Request-ID")
	if len(seen) != 2 || !generatedRequestID.MatchString(gen) {
		t.Fatalf("upstream saw %d requests, the last with X-Request-ID %q", len(seen), gen)
	}
	if l := p.accessByID(gen); l["path"] != "/api/b" || l["upstream_status"] != float64(200) {
		t.Fatalf("access line for generated id %s: %v", gen, l)
	}
	r = curl(t, "-H", "X-Key: dave", p.base+"/api/b")
	genDeny := r.header.Get("X-Request-ID")
	if r.status != 429 || !generatedRequestID.MatchString(genDeny) || genDeny == gen {
		t.Fatalf("fourth request: %d, X-Request-ID %q (first id %s)", r.status, genDeny, gen)
	}
	if l := p.accessByID(genDeny); l["status"] != float64(429) || l["deny_zones"] != "strict" {
		t.Fatalf("access line for generated deny id %s: %v", genDeny, l)
	}
	if n := len(up.requests()); n != 2 {
		t.Fatalf("upstream saw %d requests, want 2 (denies never reach it)", n)
	}
}

// combinedLine is GoAccess's COMBINED log-format as a regular expression;
// what follows the user agent is the proxy's key=value fields.
var combinedLine = regexp.MustCompile(`^(\S+) \S+ \S+ \[(\d{2}/[A-Z][a-z]{2}/\d{4}):(\d{2}:\d{2}:\d{2}) [+-]\d{4}\] "((?:[^"\\]|\\.)*)" (\d{3}) (\d+|-) "((?:[^"\\]|\\.)*)" "((?:[^"\\]|\\.)*)"(.*)$`)

// The real binary with --log-format combined: access lines read as
// nginx's combined format (checked as GoAccess's regex and by GoAccess
// itself), the proxy's fields follow, other lines stay text.
func TestCombinedLogFormat(t *testing.T) {
	c := startCluster(t)
	up := startUpstream(t)
	dir := t.TempDir()
	o := policyOpts{fail: "close", credentials: writeCredentials(t, dir, c.cred), upstream: up.addr, listen: freeAddr(t), burst: 1}
	cmd := exec.Command(binPath, "run", "--policy", writePolicy(t, dir, c, o), "--admin", "127.0.0.1:0", "--log-format", "combined", "--drain-timeout", "5s")
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var lines []string
	done := make(chan struct{})
	go func() {
		defer close(done)
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			mu.Lock()
			lines = append(lines, sc.Text())
			mu.Unlock()
		}
	}()
	snapshot := func() []string {
		mu.Lock()
		defer mu.Unlock()
		return append([]string(nil), lines...)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-done
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("proxy log:\n%s", strings.Join(snapshot(), "\n"))
		}
	})
	adminRe := regexp.MustCompile(`msg="admin listener" addr=(\S+)`)
	var admin string
	testkit.WaitFor(t, "admin listener line", func() bool {
		for _, l := range snapshot() {
			if m := adminRe.FindStringSubmatch(l); m != nil {
				admin = m[1]
				return true
			}
		}
		return false
	})
	waitReadyz(t, admin)
	base := "http://" + o.listen
	if r := curl(t, "-H", "X-Key: erin", "-A", `agent "quoted"`, "-e", "http://ref.example/", base+"/api/c?x=1"); r.status != 200 {
		t.Fatalf("first request: %d", r.status)
	}
	r := curl(t, "-H", "X-Key: erin", "-H", "X-Request-ID: e2e-erin-2", base+"/api/c")
	if r.status != 429 {
		t.Fatalf("second request: %d", r.status)
	}
	// A client that half-closes (FIN) while the upstream works aborts:
	// nothing was answered, so $status is nginx's 499.
	fin, err := net.Dial("tcp", o.listen)
	if err != nil {
		t.Fatal(err)
	}
	defer fin.Close()
	fin.SetDeadline(time.Now().Add(testkit.WaitBound))
	if _, err := io.WriteString(fin, "GET /hold/combined HTTP/1.1\r\nHost: e2e\r\nX-Key: frank\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	waitChan(t, up.held, "the upstream to get the held request")
	if err := fin.(*net.TCPConn).CloseWrite(); err != nil {
		t.Fatal(err)
	}
	waitChan(t, up.cancelled, "the upstream exchange to be cancelled")
	var access []string
	testkit.WaitFor(t, "three combined access lines", func() bool {
		access = access[:0]
		for _, l := range snapshot() {
			if combinedLine.MatchString(l) {
				access = append(access, l)
			}
		}
		return len(access) == 3
	})
	a := combinedLine.FindStringSubmatch(access[0])
	if a[1] != "127.0.0.1" || a[4] != "GET /api/c?x=1 HTTP/1.1" || a[5] != "200" || a[7] != "http://ref.example/" ||
		a[8] != `agent \x22quoted\x22` || !strings.Contains(a[9], " upstream_status=200 ") || !strings.Contains(a[9], " upstream_ttfb_ms=") {
		t.Errorf("allowed request's combined line %q", access[0])
	}
	d := combinedLine.FindStringSubmatch(access[1])
	if d[5] != "429" || !strings.Contains(d[9], " deny_zones=strict ") || !strings.Contains(d[9], " retry_after="+r.header.Get("Retry-After")+" ") ||
		!strings.Contains(d[9], " request_id=e2e-erin-2") {
		t.Errorf("denied request's combined line %q (Retry-After %s)", access[1], r.header.Get("Retry-After"))
	}
	if f := combinedLine.FindStringSubmatch(access[2]); f[4] != "GET /hold/combined HTTP/1.1" || f[5] != "499" ||
		!strings.Contains(f[9], " outcome=client_abort ") || !strings.Contains(f[9], " verdict=- ") || !strings.Contains(f[9], " report=false") {
		t.Errorf("FIN-aborted request's combined line %q", access[2])
	}
	for _, l := range snapshot() {
		if !combinedLine.MatchString(l) && !strings.HasPrefix(l, "time=") {
			t.Errorf("line neither combined nor slog text: %q", l)
		}
	}

	goaccessCounts(t, dir, access)
}

// goaccessCounts runs GoAccess (COMBINED) on lines: every one is a valid
// request.
func goaccessCounts(t *testing.T, dir string, lines []string) {
	t.Helper()
	ga := testkit.NeedTool(t, "goaccess", "goaccess")
	logf, report := filepath.Join(dir, "access.log"), filepath.Join(dir, "report.json")
	if err := os.WriteFile(logf, []byte(strings.Join(lines, "\n")+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(ga, logf, "--log-format=COMBINED", "--no-global-config", "-o", report).CombinedOutput(); err != nil {
		t.Fatalf("goaccess: %v\n%s", err, out)
	}
	var rep struct {
		General struct {
			Valid  int `json:"valid_requests"`
			Failed int `json:"failed_requests"`
		} `json:"general"`
	}
	b, err := os.ReadFile(report)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &rep); err != nil || rep.General.Valid != len(lines) || rep.General.Failed != 0 {
		t.Fatalf("goaccess: %+v (%v)", rep.General, err)
	}
}
