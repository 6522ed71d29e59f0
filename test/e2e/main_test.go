// Package e2e runs the real rl-tproxy binary end to end: curl and wrk
// against the proxy in listener mode, a 3-node pkg/rlserver cluster found
// through a real DNS SRV server, and a real upstream HTTP server.
package e2e

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/rl-tproxy/rl-tproxy/internal/bintest"
	"github.com/rl-tproxy/rl-tproxy/internal/testkit"
	"github.com/rl-tproxy/rl-tproxy/internal/testkit/rlcluster"
	"github.com/rl-tproxy/rl-tproxy/pkg/ratelimitly/credentials"
	"github.com/rl-tproxy/rl-tproxy/pkg/ratelimitly/wire"
	"github.com/rl-tproxy/rl-tproxy/pkg/rlserver"
)

var (
	binPath  string
	repoRoot string
)

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "rl-tproxy-e2e-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	repoRoot, err = bintest.ModuleRoot()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binPath, err = bintest.Build(dir)
	if err != nil {
		fmt.Fprintln(os.Stderr, "build rl-tproxy:", err)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// ---- RateLimitly cluster ----

const srvName = "_ratelimitly._udp.rl.e2e.test."

// cluster is three rlservers on 127.0.0.{2,3,4} behind a DNS SRV record
// (rlcluster).
type cluster struct {
	*rlcluster.Cluster
	cred  credentials.Credential
	cred2 credentials.Credential // a second key the servers accept (rotation)
	// Toggles read by the servers' hooks.
	dropRequests atomic.Bool // drop RATE_REQUESTs and COMPLETIONs (client times out)
	extraResult  atomic.Bool // answer with one resource result too many
}

func newCredential(t *testing.T, keyID uint32) credentials.Credential {
	t.Helper()
	return rlcluster.NewCredential(t, "e2e", keyID)
}

func startCluster(t *testing.T) *cluster {
	t.Helper()
	c := &cluster{cred: newCredential(t, 11), cred2: newCredential(t, 12)}
	hooks := &rlserver.TestHooks{
		DropRequest: func(h *wire.Header) bool {
			return c.dropRequests.Load() && (h.Kind == wire.KindRateRequest || h.Kind == wire.KindCompletion)
		},
		MutateResponse: func(r *wire.RateResponse) {
			if c.extraResult.Load() {
				r.Resources = append(r.Resources, wire.ResourceResult{Remaining: 1})
			}
		},
	}
	c.Cluster = rlcluster.Start(t, rlcluster.Config{SRV: srvName, Domain: "e2e.test.", DistinctIPs: true, TTL: 5,
		Credentials: []credentials.Credential{c.cred, c.cred2},
		Node:        func(_ int, cfg *rlserver.Config) { cfg.Hooks = hooks }})
	return c
}

func writeCredentials(t *testing.T, dir string, c credentials.Credential) string {
	t.Helper()
	return bintest.WriteFile(t, filepath.Join(dir, "credentials.yaml"), rlcluster.CredentialYAML(c), 0o600)
}

// freeAddr returns a loopback address with a port that was free a moment
// ago (the policy needs a concrete port).
func freeAddr(t *testing.T) string {
	t.Helper()
	return testkit.FreeAddr(t)
}

// ---- upstream ----

type upstream struct {
	srv   *http.Server
	addr  string
	delay atomic.Int64 // ns
	hits  atomic.Int64
	// A request for /hold/... waits until the proxy cancels it (its
	// request context ends): held reports its start, cancelled its end.
	held, cancelled chan string
}

func startUpstream(t *testing.T) *upstream {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	u := &upstream{addr: ln.Addr().String(), held: make(chan string, 16), cancelled: make(chan string, 16)}
	u.srv = &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u.hits.Add(1)
		if strings.HasPrefix(r.URL.Path, "/hold/") {
			u.held <- r.URL.Path
			select {
			case <-r.Context().Done():
				u.cancelled <- r.URL.Path
			case <-time.After(testkit.WaitBound): // a hang guard: the proxy never cancelled
			}
			return
		}
		if d := time.Duration(u.delay.Load()); d > 0 {
			time.Sleep(d) // the simulated slow service under test
		}
		w.Header().Set("RateLimit", `"upstream";r=1;t=9`)
		fmt.Fprintf(w, "upstream %s %s\n", r.Method, r.URL.Path)
	})}
	go func() { _ = u.srv.Serve(ln) }()
	t.Cleanup(func() { u.srv.Close() })
	return u
}

// ---- the proxy process ----

type proxyProc struct {
	t        *testing.T
	cmd      *exec.Cmd
	policy   string
	base     string // http://127.0.0.1:port
	admin    string // 127.0.0.1:port
	mu       sync.Mutex
	lines    []map[string]any
	raw      []string
	exited   chan struct{}
	exitCode int
}

// startProxy runs `rl-tproxy run` on policy (JSON logs) and waits until
// it is ready (/readyz 200).
func startProxy(t *testing.T, policy string, waitReady bool, extra ...string) *proxyProc {
	t.Helper()
	args := append([]string{"run", "--policy", policy, "--admin", "127.0.0.1:0", "--log-format", "json", "--drain-timeout", "5s"}, extra...)
	cmd := exec.Command(binPath, args...)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout = os.Stdout
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &proxyProc{t: t, cmd: cmd, policy: policy, exited: make(chan struct{})}
	scanDone := make(chan struct{})
	go func() {
		defer close(scanDone)
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			line := sc.Text()
			var m map[string]any
			p.mu.Lock()
			p.raw = append(p.raw, line)
			if json.Unmarshal([]byte(line), &m) == nil {
				p.lines = append(p.lines, m)
			} else {
				p.lines = append(p.lines, map[string]any{"msg": "NOT JSON", "line": line})
			}
			p.mu.Unlock()
		}
	}()
	go func() {
		<-scanDone
		_ = cmd.Wait()
		p.exitCode = cmd.ProcessState.ExitCode()
		close(p.exited)
	}()
	t.Cleanup(func() {
		select {
		case <-p.exited:
		default:
			_ = cmd.Process.Signal(syscall.SIGTERM)
			select {
			case <-p.exited:
			case <-time.After(10 * time.Second):
				_ = cmd.Process.Kill()
				<-p.exited
			}
		}
		p.checkJSON()
		if t.Failed() {
			p.mu.Lock()
			t.Logf("proxy log (%s):\n%s", policy, strings.Join(p.raw, "\n"))
			p.mu.Unlock()
		}
	})
	testkit.WaitFor(t, "proxy listening and admin up", func() bool {
		select {
		case <-p.exited:
			p.mu.Lock()
			defer p.mu.Unlock()
			t.Fatalf("proxy exited (%d):\n%s", p.exitCode, strings.Join(p.raw, "\n"))
		default:
		}
		for _, m := range p.snapshot() {
			switch m["msg"] {
			case "listening":
				p.base = "http://" + m["addr"].(string)
			case "admin listener":
				p.admin = m["addr"].(string)
			}
		}
		return p.base != "" && p.admin != ""
	})
	if !waitReady {
		return p
	}
	waitReadyz(t, p.admin)
	return p
}

// waitReadyz waits until the admin listener at addr answers /readyz 200.
func waitReadyz(t *testing.T, addr string) {
	t.Helper()
	testkit.WaitFor(t, "/readyz 200", func() bool {
		resp, err := http.Get("http://" + addr + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == 200
	})
}

func (p *proxyProc) snapshot() []map[string]any {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]map[string]any(nil), p.lines...)
}

// checkJSON fails the test if any log line was not JSON.
func (p *proxyProc) checkJSON() {
	for _, m := range p.snapshot() {
		if m["msg"] == "NOT JSON" {
			p.t.Errorf("log line is not JSON: %q", m["line"])
		}
	}
}

// access returns the access log lines.
func (p *proxyProc) access() []map[string]any {
	var out []map[string]any
	for _, m := range p.snapshot() {
		if m["msg"] == "access" {
			out = append(out, m)
		}
	}
	return out
}

// waitAccess waits for at least n access lines and returns the n-th.
func (p *proxyProc) waitAccess(n int) map[string]any {
	p.t.Helper()
	var lines []map[string]any
	testkit.WaitFor(p.t, fmt.Sprintf("%d access lines", n), func() bool {
		lines = p.access()
		return len(lines) >= n
	})
	return lines[n-1]
}

func (p *proxyProc) signal(s os.Signal) {
	if err := p.cmd.Process.Signal(s); err != nil {
		p.t.Fatal(err)
	}
}

// metric returns the value of one exact series line from /metrics (0
// when absent).
func (p *proxyProc) metric(series string) float64 {
	p.t.Helper()
	body := p.scrape()
	for _, l := range strings.Split(body, "\n") {
		if rest, ok := strings.CutPrefix(l, series+" "); ok {
			var v float64
			fmt.Sscan(rest, &v)
			return v
		}
	}
	return 0
}

func (p *proxyProc) scrape() string {
	p.t.Helper()
	resp, err := http.Get("http://" + p.admin + "/metrics")
	if err != nil {
		p.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

// ---- curl ----

type curlResult struct {
	status int
	header http.Header
	body   string
}

// curl runs the real curl against the proxy.
func curl(t *testing.T, args ...string) curlResult {
	t.Helper()
	testkit.NeedTool(t, "curl", "curl")
	full := append([]string{"-s", "-S", "--max-time", "10", "-D", "-", "-o", "/dev/stderr"}, args...)
	cmd := exec.Command("curl", full...)
	var out, body bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &body
	if err := cmd.Run(); err != nil {
		t.Fatalf("curl %v: %v: %s", args, err, body.String())
	}
	resp, err := http.ReadResponse(bufio.NewReader(&out), nil)
	if err != nil {
		t.Fatalf("curl %v: parse head: %v\n%s", args, err, out.String())
	}
	return curlResult{status: resp.StatusCode, header: resp.Header, body: body.String()}
}

// ---- policies ----

type policyOpts struct {
	fail        string
	credentials string
	upstream    string
	rate        string // zone "strict" rate
	burst       int
	extra       string   // appended to the locations list
	service     string   // service settings (indented lines) before its locations
	tiers       string   // a top-level tiers block
	defaults    string   // a top-level defaults block
	zones       string   // appended to the zones block
	srv         string   // SRV name; "" = the cluster's
	listen      string   // "" = a free loopback port
	notReady    bool     // do not wait for /readyz (discovery cannot succeed)
	args        []string // extra `run` flags
}

func writePolicy(t *testing.T, dir string, c *cluster, o policyOpts) string {
	t.Helper()
	if o.rate == "" {
		o.rate = "5/m"
	}
	if o.burst == 0 {
		o.burst = 3
	}
	if o.srv == "" {
		o.srv = srvName
	}
	if o.listen == "" {
		o.listen = freeAddr(t)
	}
	body := fmt.Sprintf(`ratelimitly:
  srv: %s
  resolver: %s
  resolver_timeout: 1s
  credentials: %s
  request_policy: {name: standard, unit: 250ms}  # generous: CI machines are shared
  fail: %s
%s%szones:
  strict: {bucket: "k:{header.x-key}", rate: %s, burst: %d}
  dyn: {bucket: "{header.x-key}", rate: 100/s, burst: 2}
%strackers:
  slow: {service: "slow:{host}"}
services:
  - name: web
    listen: %s
    upstream: %s
%s    locations:
      - name: probe
        match: {path: /probe}
        report: slow
      - name: guarded
        match: {path_prefix: /guarded}
        guard: [{tracker: slow, threshold: 100ms}]
        report: slow
      - name: shadow
        match: {path_prefix: /shadow}
        limit: [strict]
        mode: shadow
        report: slow
      - name: dyn
        match: {path_prefix: /dyn}
        limit: [dyn]
        report: slow
%s      - name: api
        match: {path_prefix: /}
        limit: [strict]
        report: slow
`, o.srv, c.DNS.Addr(), o.credentials, o.fail, o.defaults, o.tiers, o.rate, o.burst, o.zones, o.listen, o.upstream, o.service, o.extra)
	return bintest.WriteFile(t, filepath.Join(dir, "policy.yaml"), body, 0o644)
}

// env is one test's cluster, upstream and proxy.
type env struct {
	c    *cluster
	up   *upstream
	dir  string
	p    *proxyProc
	opts policyOpts
}

func newEnv(t *testing.T, c *cluster, o policyOpts) *env {
	t.Helper()
	if c == nil {
		c = startCluster(t)
	}
	e := &env{c: c, up: startUpstream(t), dir: t.TempDir()}
	if o.credentials == "" {
		o.credentials = writeCredentials(t, e.dir, c.cred)
	}
	if o.fail == "" {
		o.fail = "close"
	}
	o.upstream = e.up.addr
	o.listen = freeAddr(t)
	e.opts = o
	e.p = startProxy(t, writePolicy(t, e.dir, c, o), !o.notReady, o.args...)
	return e
}

func (e *env) get(t *testing.T, path string, hdr ...string) curlResult {
	t.Helper()
	args := []string{}
	for _, h := range hdr {
		args = append(args, "-H", h)
	}
	return curl(t, append(args, e.p.base+path)...)
}
