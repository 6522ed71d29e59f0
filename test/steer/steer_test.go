package steer

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/rl-tproxy/rl-tproxy/internal/testkit"
)

// TestSteerNginxIPv4 and TestSteerNginxIPv6: curl and wrk from the client
// namespace hit nginx's own address on port 80; the proxy, steered there
// by sk_lookup, admits the burst then answers 429 with Retry-After, adds
// X-Forwarded-For/X-Real-IP with the client's address (nginx's access log
// shows them), and its upstream connection to nginx is not steered back to
// itself (every request appears once in each log).
func TestSteerNginxIPv4(t *testing.T) { testSteerNginx(t, false) }

func TestSteerNginxIPv6(t *testing.T) { testSteerNginx(t, true) }

func testSteerNginx(t *testing.T, v6 bool) {
	e := newEnv(t, v6)
	client := e.clientIP.String()
	loop := "127.0.0.1"
	if v6 {
		loop = "::1"
	}

	// Without a proxy nginx answers the client itself.
	if r := e.curl("/open/before"); r.status != 200 || !strings.Contains(r.body, "xff= ") {
		t.Fatalf("nginx before the proxy: %d %q", r.status, r.body)
	}

	px := e.startProxy(proxyName)

	want := fmt.Sprintf("nginx xff=%s xrealip=%s\n", client, client)
	if r := e.curl("/open/first"); r.status != 200 || r.body != want {
		t.Fatalf("unprotected request through the proxy: %d %q, want 200 %q", r.status, r.body, want)
	}
	for i := 1; i <= burst; i++ {
		if r := e.curl(fmt.Sprintf("/limited/%d", i)); r.status != 200 || r.body != want {
			t.Fatalf("request %d of the burst: %d %q, want 200 %q", i, r.status, r.body, want)
		}
	}
	r := e.curl("/limited/over")
	if r.status != 429 {
		t.Fatalf("request after the burst of %d: %d %q, want 429", burst, r.status, r.body)
	}
	if ra, err := strconv.Atoi(r.header.Get("Retry-After")); err != nil || ra < 1 {
		t.Fatalf("429 Retry-After %q, want whole seconds >= 1 (headers %v)", r.header.Get("Retry-After"), r.header)
	}

	// wrk's location has its own bucket (same burst) for the client.
	w := e.wrk(e.pair.Client.Name, e.url("/wrk/"), 4, "2s", false)
	t.Logf("wrk: %+v", w)
	if w.other != 0 || w.connectErrs != 0 || w.s200 < burst || w.s429 == 0 || w.s200+w.s429 != w.requests {
		t.Fatalf("wrk: %+v; want only 200 (at least the burst of %d) and 429 answers, no connect errors", w, burst)
	}
	if w.nonSuccess != w.s429 {
		t.Fatalf("wrk reports %d non-2xx answers, its response hook counted %d 429s", w.nonSuccess, w.s429)
	}

	// Admitted requests reach nginx exactly once each; the proxy logs
	// each request once, and only with the client as the peer. nginx's
	// count lies between the admitted requests the proxy answered 200 and
	// all it admitted (a request wrk abandoned when it stopped may have
	// been admitted and not forwarded); a loop or a duplicate would leave
	// it outside.
	protected := func(m map[string]any) bool {
		path := fmt.Sprint(m["path"])
		return strings.HasPrefix(path, "/limited/") || path == "/wrk/"
	}
	var nginxProtected, answered200, allowed int
	testkit.WaitWithin(t, waitBound, "nginx's protected lines to match the proxy's admitted requests", func() bool {
		lines := e.nginxLines()
		nginxProtected = countLines(lines, "uri=/limited/") + countLines(lines, "uri=/wrk/ ")
		answered200, allowed = 0, 0
		for _, m := range px.access() {
			if !protected(m) {
				continue
			}
			if m["verdict"] == "allow" {
				allowed++
				if m["status"] == float64(200) {
					answered200++
				}
			}
		}
		return answered200 <= nginxProtected && nginxProtected <= allowed && nginxProtected >= burst+w.s200
	})
	// wrk stops with up to its 4 connections' requests in flight: they may
	// have been admitted without wrk counting the answer.
	if nginxProtected > burst+w.s200+4 {
		t.Fatalf("nginx served %d protected requests, the clients saw %d admitted (+4 in flight at most)", nginxProtected, burst+w.s200)
	}
	lines := e.nginxLines()
	for _, l := range lines {
		if !strings.Contains(l, "uri=/limited/") && !strings.Contains(l, "uri=/open/first") && !strings.Contains(l, "uri=/wrk/") {
			continue
		}
		wantLine := fmt.Sprintf(`peer=%s `, loop)
		if !strings.HasPrefix(l, wantLine) || !strings.Contains(l, fmt.Sprintf(`xff="%s" xrealip="%s"`, client, client)) {
			t.Fatalf("nginx access line %q: want peer %s (the proxy) and X-Forwarded-For/X-Real-IP exactly %s", l, loop, client)
		}
	}
	if n := countLines(lines, "peer="+client+" uri=/open/before ", `xff="-" xrealip="-"`); n != 1 {
		t.Fatalf("nginx lines for the direct request: %d, want 1\n%s", n, strings.Join(lines, "\n"))
	}
	for _, path := range []string{"/open/first", "/limited/1", "/limited/5"} {
		if n := countLines(lines, "uri="+path+" "); n != 1 {
			t.Fatalf("nginx lines for %s: %d, want exactly 1 (no loop)", path, n)
		}
	}
	if n := countLines(lines, "uri=/limited/over "); n != 0 {
		t.Fatalf("the denied request reached nginx %d times", n)
	}
	recs := px.access()
	perPath := map[string]int{}
	for _, m := range recs {
		remote := fmt.Sprint(m["remote"])
		if !strings.HasPrefix(remote, client+":") && !strings.HasPrefix(remote, "["+client+"]:") {
			t.Fatalf("proxy access record from %s (want only the client %s: a loop would show the proxy's own address): %v", remote, client, m)
		}
		perPath[fmt.Sprint(m["path"])]++
	}
	for _, path := range []string{"/open/first", "/limited/1", "/limited/5", "/limited/over"} {
		if perPath[path] != 1 {
			t.Fatalf("proxy access records for %s: %d, want 1", path, perPath[path])
		}
	}
	if got := perPath["/wrk/"]; got < w.requests || got > w.requests+4 {
		t.Fatalf("proxy access records for wrk's path: %d, wrk completed %d (+4 in flight at most)", got, w.requests)
	}

	// The kernel side agrees: connections were steered, the proxy's
	// upstream connections bypassed.
	c := e.counters()
	if c["steered"] == 0 || c["bypassed"] == 0 {
		t.Fatalf("redirect counters %v: want steered and bypassed > 0", c)
	}
	t.Logf("redirect counters: %v; nginx served %d protected requests (proxy: %d admitted, %d answered 200), wrk %+v", c, nginxProtected, allowed, answered200, w)
}

// wrkResult is wrk's outcome as its Lua hooks and summary report it.
type wrkResult struct {
	requests, s200, s429, other            int
	nonSuccess                             int // "Non-2xx or 3xx responses"
	connectErrs, readErrs, writeErrs, tmos int
	reqPerSec                              float64
}

const wrkScript = `
local threads = {}
function setup(thread) table.insert(threads, thread) end
function response(status, headers, body)
  if status == 200 then s200 = (s200 or 0) + 1
  elseif status == 429 then s429 = (s429 or 0) + 1
  else sother = (sother or 0) + 1 end
end
function done(summary, latency, requests)
  local a, b, c = 0, 0, 0
  for _, th in ipairs(threads) do
    a = a + (th:get("s200") or 0); b = b + (th:get("s429") or 0); c = c + (th:get("sother") or 0)
  end
  io.write(string.format("STEER requests=%d s200=%d s429=%d other=%d connect=%d read=%d write=%d timeout=%d status=%d\n",
    summary.requests, a, b, c, summary.errors.connect, summary.errors.read, summary.errors.write,
    summary.errors.timeout, summary.errors.status))
end
`

var wrkRPS = regexp.MustCompile(`Requests/sec:\s+([0-9.]+)`)

// wrk runs a bounded wrk (-t1) in namespace ns against url and parses its
// report. closeConn adds Connection: close (one connection per request).
func (e *env) wrk(ns, url string, conns int, dur string, closeConn bool) wrkResult {
	e.t.Helper()
	w, err := e.runWrk(ns, url, conns, dur, closeConn)
	if err != nil {
		e.t.Fatal(err)
	}
	return w
}

// runWrk is wrk without the test's Fatal, for use from other goroutines.
func (e *env) runWrk(ns, url string, conns int, dur string, closeConn bool) (wrkResult, error) {
	var w wrkResult
	script := filepath.Join(e.dir, "steer.lua")
	if err := os.WriteFile(script, []byte(wrkScript), 0o644); err != nil {
		return w, err
	}
	args := []string{"netns", "exec", ns, "wrk", "-t1", fmt.Sprintf("-c%d", conns), "-d" + dur, "--timeout", "10s", "-s", script}
	if closeConn {
		args = append(args, "-H", "Connection: close")
	}
	ctx, cancel := context.WithTimeout(context.Background(), waitBound)
	defer cancel()
	out, err := exec.CommandContext(ctx, "ip", append(args, url)...).CombinedOutput()
	if err != nil {
		return w, fmt.Errorf("wrk: %w\n%s", err, out)
	}
	found := false
	sc := bufio.NewScanner(strings.NewReader(string(out)))
	for sc.Scan() {
		l := sc.Text()
		if strings.HasPrefix(l, "STEER ") {
			_, err := fmt.Sscanf(l, "STEER requests=%d s200=%d s429=%d other=%d connect=%d read=%d write=%d timeout=%d status=%d",
				&w.requests, &w.s200, &w.s429, &w.other, &w.connectErrs, &w.readErrs, &w.writeErrs, &w.tmos, &w.nonSuccess)
			if err != nil {
				return w, fmt.Errorf("wrk summary %q: %w", l, err)
			}
			found = true
		}
	}
	if m := wrkRPS.FindStringSubmatch(string(out)); m != nil {
		w.reqPerSec, _ = strconv.ParseFloat(m[1], 64)
	}
	if !found {
		return w, fmt.Errorf("wrk printed no summary line:\n%s", out)
	}
	return w, nil
}

// counters runs `rl-tproxy redirect status` in the node namespace and
// returns its counters.
func (e *env) counters() map[string]uint64 {
	t := e.t
	t.Helper()
	out, err := runBounded(t, waitBound, "nsenter", e.nodeArgs("redirect", "status")...)
	if err != nil {
		t.Fatalf("redirect status: %v\n%s", err, out)
	}
	c := map[string]uint64{}
	inCounters := false
	for _, l := range strings.Split(string(out), "\n") {
		if strings.TrimSpace(l) == "counters:" {
			inCounters = true
			continue
		}
		f := strings.Fields(l)
		if inCounters && len(f) == 2 {
			if v, err := strconv.ParseUint(f[1], 10, 64); err == nil {
				c[f[0]] = v
			}
		}
	}
	if len(c) == 0 {
		t.Fatalf("no counters in redirect status:\n%s", out)
	}
	return c
}
