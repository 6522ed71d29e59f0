package fault

import (
	"bufio"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/rl-tproxy/rl-tproxy/internal/testkit"
	"github.com/rl-tproxy/rl-tproxy/internal/testkit/rlcluster"
)

// procFDs returns the number of open fds of pid and how many of them are
// TCP connections to remotePort (the upstream pool), from /proc.
func procFDs(t testing.TB, pid int, remotePort uint16) (fds, upstream int) {
	t.Helper()
	fdDir := fmt.Sprintf("/proc/%d/fd", pid)
	ents, err := os.ReadDir(fdDir)
	if err != nil {
		t.Fatalf("read %s: %v", fdDir, err)
	}
	inodes := map[string]bool{}
	for _, e := range ents {
		if l, err := os.Readlink(filepath.Join(fdDir, e.Name())); err == nil && strings.HasPrefix(l, "socket:[") {
			inodes[strings.TrimSuffix(strings.TrimPrefix(l, "socket:["), "]")] = true
		}
	}
	for _, f := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		fh, err := os.Open(f)
		if err != nil {
			continue
		}
		sc := bufio.NewScanner(fh)
		for sc.Scan() {
			fs := strings.Fields(sc.Text())
			if len(fs) < 10 || fs[0] == "sl" || !inodes[fs[9]] {
				continue
			}
			i := strings.LastIndexByte(fs[2], ':')
			if port, err := strconv.ParseUint(fs[2][i+1:], 16, 16); err == nil && uint16(port) == remotePort {
				upstream++
			}
		}
		fh.Close()
	}
	return len(ents), upstream
}

// abortMode is how one request ends.
type abortMode int

const (
	modeComplete     abortMode = iota // full exchange, connection reused for the next request
	modeMidHead                       // part of the head, then close
	modeAfterHead                     // whole head, close at once (during admission)
	modeAfterHeadRST                  // whole head, close with RST
	modeMidBody                       // POST with a partial body, then close
	modeMidResponse                   // read 1 KiB of a 256 KiB response, then close
	numModes
)

var modeNames = [...]string{"complete", "mid_head", "after_head", "after_head_rst", "mid_body", "mid_response"}

// aborter runs one client connection's share of the requests.
type aborter struct {
	addr string
	rng  *rand.Rand
	conn net.Conn
	br   *bufio.Reader
}

func (a *aborter) close(rst bool) {
	if a.conn == nil {
		return
	}
	if rst {
		if tc, ok := a.conn.(*net.TCPConn); ok {
			_ = tc.SetLinger(0)
		}
	}
	_ = a.conn.Close()
	a.conn, a.br = nil, nil
}

func (a *aborter) dial() error {
	if a.conn != nil {
		return nil
	}
	c, err := net.Dial("tcp", a.addr)
	if err != nil {
		return err
	}
	a.conn, a.br = c, bufio.NewReader(c)
	return nil
}

// one performs one request in mode m. It returns the HTTP status for a
// complete exchange (0 for an abort).
func (a *aborter) one(m abortMode) (int, error) {
	if err := a.dial(); err != nil {
		return 0, err
	}
	_ = a.conn.SetDeadline(time.Now().Add(30 * time.Second))
	path := "/api/x"
	if a.rng.IntN(4) == 0 {
		path = "/open/x" // unprotected
	}
	head := "GET " + path + " HTTP/1.1\r\nHost: fault\r\nX-Key: abort\r\n\r\n"
	switch m {
	case modeComplete:
		if _, err := io.WriteString(a.conn, head); err != nil {
			return 0, err
		}
		resp, err := http.ReadResponse(a.br, nil)
		if err != nil {
			return 0, err
		}
		_, err = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if err != nil {
			return 0, err
		}
		if a.rng.IntN(8) == 0 {
			a.close(false)
		}
		return resp.StatusCode, nil
	case modeMidHead:
		_, _ = io.WriteString(a.conn, head[:1+a.rng.IntN(len(head)-2)])
		a.close(a.rng.IntN(2) == 0)
	case modeAfterHead:
		_, _ = io.WriteString(a.conn, head)
		a.close(false)
	case modeAfterHeadRST:
		_, _ = io.WriteString(a.conn, head)
		a.close(true)
	case modeMidBody:
		_, _ = io.WriteString(a.conn, "POST "+path+" HTTP/1.1\r\nHost: fault\r\nX-Key: abort\r\nContent-Length: 100000\r\n\r\n"+strings.Repeat("b", 1000))
		a.close(a.rng.IntN(2) == 0)
	case modeMidResponse:
		_, _ = io.WriteString(a.conn, "GET "+path+"/big HTTP/1.1\r\nHost: fault\r\nX-Key: abort\r\n\r\n")
		_, _ = io.ReadFull(a.br, make([]byte, 1024))
		a.close(a.rng.IntN(2) == 0)
	}
	return 0, nil
}

// faultN is the number of requests of the abort test: 20000, or RL_FAULT_N.
func faultN(t testing.TB) int {
	n := 20000
	if s := os.Getenv("RL_FAULT_N"); s != "" {
		v, err := strconv.Atoi(s)
		if err != nil || v < 1 {
			t.Fatalf("RL_FAULT_N=%q: want a positive integer", s)
		}
		n = v
	}
	return n
}

// causeLines returns the non-zero admission and outcome series of a scrape.
func causeLines(body string) string {
	var out []string
	for _, l := range strings.Split(body, "\n") {
		if (strings.HasPrefix(l, "rl_tproxy_ratelimitly_checks_total") || strings.HasPrefix(l, "rl_tproxy_requests_total") ||
			strings.HasPrefix(l, "rl_tproxy_admission_causes_total") || strings.HasPrefix(l, "rl_tproxy_ratelimitly_datagrams")) && !strings.HasSuffix(l, " 0") {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

type abortRun struct {
	modes    []int
	statuses map[int]int
	errs     int64
	firstErr any
}

// runAborts sends n requests over conc connections, half of them aborted
// at a random point (seeds differ by seedBase).
func runAborts(t testing.TB, addr string, n, conc int, seedBase uint64) abortRun {
	var next atomic.Int64
	var mu sync.Mutex
	r := abortRun{modes: make([]int, numModes), statuses: map[int]int{}}
	var errs atomic.Int64
	var firstErr atomic.Value
	var wg sync.WaitGroup
	for w := 0; w < conc; w++ {
		wg.Add(1)
		go func(seed uint64) {
			defer wg.Done()
			a := &aborter{addr: addr, rng: rand.New(rand.NewPCG(seed, 42))}
			defer a.close(false)
			modes := make([]int, numModes)
			st := map[int]int{}
			for next.Add(1) <= int64(n) {
				m := modeComplete
				if a.rng.IntN(2) == 0 { // half the requests abort
					m = abortMode(1 + a.rng.IntN(int(numModes)-1))
				}
				modes[m]++
				code, err := a.one(m)
				if err != nil {
					errs.Add(1)
					firstErr.CompareAndSwap(nil, fmt.Sprintf("%s: %v", modeNames[m], err))
					a.close(false)
					continue
				}
				if m == modeComplete {
					st[code]++
				}
			}
			mu.Lock()
			for i, v := range modes {
				r.modes[i] += v
			}
			for k, v := range st {
				r.statuses[k] += v
			}
			mu.Unlock()
		}(seedBase + uint64(w) + 1)
	}
	wg.Wait()
	r.errs, r.firstErr = errs.Load(), firstErr.Load()
	return r
}

// (e) Many requests, a random share of them aborted by the client at a
// random point (mid-head, during admission, mid-body, mid-response, with
// FIN or RST). Afterwards no client connection or admission is left open,
// the proxy's non-upstream fds (/proc/PID/fd) are back to their baseline,
// the upstream pool stays within the clients' concurrency, go_goroutines
// is within the baseline plus the admission watcher pool's bound (two per
// connection), and a goroutine dump shows no connection goroutine and no
// check left.
func TestRandomClientAborts(t *testing.T) {
	n := faultN(t)
	const conc = 32
	c := startCluster(t)
	up := startUpstream(t)
	dir := t.TempDir()
	creds := writeFile(t, filepath.Join(dir, "credentials.yaml"), rlcluster.CredentialYAML(c.cred))
	pol, listen := writePolicy(t, dir, c, policyOpts{fail: "open", unit: "250ms", creds: creds, upstream: up.addr})
	p := startProxy(t, pol, listen, "warn", false) // no access log: RL_FAULT_N can be 1M
	_, upPortS, _ := net.SplitHostPort(up.addr)
	upPort64, _ := strconv.ParseUint(upPortS, 10, 16)
	upPort := uint16(upPort64)

	settled := func() (goroutines float64, fds, upConns int, open float64, inflight float64) {
		body := p.scrape()
		fds, upConns = procFDs(t, p.pid(), upPort)
		return seriesValue(body, "go_goroutines"), fds, upConns,
			seriesValue(body, "rl_tproxy_open_connections"), seriesValue(body, "rl_tproxy_admission_inflight")
	}
	// Warm-up: the same workload (aborts included) at the same
	// concurrency starts whatever the proxy starts lazily and fills the
	// upstream pool; then the baseline is the idle state after it.
	warm := runAborts(t, strings.TrimPrefix(p.base, "http://"), 2000, conc, 1000)
	if warm.errs != 0 || warm.statuses[200] != warm.modes[modeComplete] {
		t.Fatalf("warm-up: %d errors (first %v), statuses %v for %d complete exchanges\n%s", warm.errs, warm.firstErr, warm.statuses, warm.modes[modeComplete], causeLines(p.scrape()))
	}
	testkit.WaitWithin(t, 60*time.Second, "no open client connection or admission after the warm-up", func() bool {
		_, _, _, open, inflight := settled()
		return open == 0 && inflight == 0
	})
	// Idle background goroutines (discovery refresh, timers) come and go:
	// the baseline is the largest of a few idle samples.
	var g0 float64
	var fd0, up0 int
	for i := 0; i < 5; i++ {
		g, fd, upc, _, _ := settled()
		if g > g0 {
			g0 = g
		}
		if fd-upc > fd0-up0 {
			fd0, up0 = fd, upc
		}
	}
	t.Logf("baseline: %v goroutines, %d fds (%d upstream connections)", g0, fd0, up0)

	start := time.Now()
	r := runAborts(t, strings.TrimPrefix(p.base, "http://"), n, conc, 0)
	elapsed := time.Since(start)
	byMode, statuses := r.modes, r.statuses
	if r.errs != 0 {
		t.Fatalf("%d client errors on complete exchanges (first: %v)", r.errs, r.firstErr)
	}
	if statuses[200] != byMode[modeComplete] {
		t.Fatalf("complete exchanges: statuses %v, want %d × 200\n%s", statuses, byMode[modeComplete], causeLines(p.scrape()))
	}

	var g, fds, upConns int
	var open, inflight float64
	deadline := time.Now().Add(120 * time.Second)
	for first := true; ; first = false {
		var gf float64
		gf, fds, upConns, open, inflight = settled()
		g = int(gf)
		if first {
			t.Logf("right after the run: %d goroutines, %d fds of which %d upstream, open connections %v, admissions in flight %v", g, fds, upConns, open, inflight)
		}
		if open == 0 && inflight == 0 && gf <= g0+2*conc && fds-upConns <= fd0-up0 && upConns <= conc {
			t.Logf("back to baseline %.1fs after the run", time.Since(start.Add(elapsed)).Seconds())
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("not back to baseline after 120s: %d goroutines (baseline %v), %d fds of which %d upstream (baseline %d, %d), open connections %v, admissions in flight %v",
				g, g0, fds, upConns, fd0, up0, open, inflight)
		}
		time.Sleep(20 * time.Millisecond)
	}
	body := p.scrape()
	var outcomes []string
	for _, o := range []string{"allow", "bypass", "client_abort", "fail_close", "fail_open", "deny"} {
		v := 0.0
		for _, loc := range []string{"adm", "open"} {
			v += seriesValue(body, `rl_tproxy_requests_total{location="`+loc+`",outcome="`+o+`",service="web"}`)
		}
		outcomes = append(outcomes, fmt.Sprintf("%s=%v", o, v))
	}
	var modes []string
	for i, v := range byMode {
		modes = append(modes, fmt.Sprintf("%s=%d", modeNames[i], v))
	}
	t.Logf("%d requests in %v with %d connections: %s", n, elapsed.Round(time.Millisecond), conc, strings.Join(modes, " "))
	var causes []string
	for _, l := range strings.Split(body, "\n") {
		if strings.HasPrefix(l, "rl_tproxy_admission_causes_total") && !strings.HasSuffix(l, " 0") {
			causes = append(causes, strings.TrimPrefix(l, "rl_tproxy_admission_causes_total"))
		}
	}
	t.Logf("admission causes: %s", strings.Join(causes, " "))
	t.Logf("proxy outcomes (warm-up included): %s; client causes: cancelled=%v timeout=%v",
		strings.Join(outcomes, " "),
		seriesValue(body, `rl_tproxy_ratelimitly_checks_total{cause="cancelled"}`),
		seriesValue(body, `rl_tproxy_ratelimitly_checks_total{cause="timeout"}`))
	fo := seriesValue(body, `rl_tproxy_requests_total{location="adm",outcome="fail_open",service="web"}`)
	t.Logf("after: %d goroutines (baseline %v), %d fds of which %d upstream (baseline %d, %d), open connections %v, admissions in flight %v",
		g, g0, fds, upConns, fd0, up0, open, inflight)
	if fo != 0 {
		t.Logf("NOTE: %v admissions failed open (no valid RateLimitly answer within the horizon) during the abort workload", fo)
	}
	// The goroutines themselves: SIGQUIT makes the Go runtime print every
	// goroutine's stack and exit. No connection goroutine and no check may
	// remain; the admission watcher pool is bounded by the peak number of
	// concurrent admissions.
	dump := goroutineDump(t, p)
	watchers, perConn, checks := 0, 0, 0
	for _, g := range dump {
		switch {
		case strings.Contains(g, "pkg/proxy.(*watchers).loop"):
			watchers++
		case strings.Contains(g, "pkg/proxy.(*conn)."):
			perConn++
		case strings.Contains(g, "pkg/rlclient.(*Client).Check"):
			checks++
		}
	}
	t.Logf("goroutine dump: %d goroutines, %d admission watchers (pool), %d connection goroutines, %d goroutines in Check", len(dump), watchers, perConn, checks)
	if perConn != 0 || checks != 0 {
		t.Fatalf("%d connection goroutines and %d checks left after every client went away", perConn, checks)
	}
	// A watcher returns itself to the pool just after its admission ends,
	// so a connection's next admission can start a new one meanwhile: at
	// most two per connection.
	if watchers > 2*conc {
		t.Fatalf("%d admission watchers for %d connections (bound %d)", watchers, conc, 2*conc)
	}
}

// goroutineDump stops p with SIGQUIT and returns the stacks the Go
// runtime prints, one string per goroutine.
func goroutineDump(t *testing.T, p *proxyProc) []string {
	t.Helper()
	if err := p.cmd.Process.Signal(syscall.SIGQUIT); err != nil {
		t.Fatal(err)
	}
	select {
	case <-p.exited:
	case <-time.After(30 * time.Second):
		t.Fatal("no exit 30s after SIGQUIT")
	}
	var out []string
	var cur []string
	in := false
	for _, l := range p.lines() {
		if strings.HasPrefix(l, "SIGQUIT") {
			in = true
			continue
		}
		if !in {
			continue
		}
		if strings.HasPrefix(l, "goroutine ") {
			if cur != nil {
				out = append(out, strings.Join(cur, "\n"))
			}
			cur = []string{l}
		} else if cur != nil {
			cur = append(cur, l)
		}
	}
	if cur != nil {
		out = append(out, strings.Join(cur, "\n"))
	}
	if len(out) == 0 {
		t.Fatal("no goroutine dump after SIGQUIT")
	}
	return out
}
