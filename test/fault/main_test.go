package fault

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/rl-tproxy/rl-tproxy/internal/bintest"
	"github.com/rl-tproxy/rl-tproxy/internal/dnstest"
	"github.com/rl-tproxy/rl-tproxy/internal/testkit"
	"github.com/rl-tproxy/rl-tproxy/internal/testkit/rlcluster"
	"github.com/rl-tproxy/rl-tproxy/pkg/ratelimitly/credentials"
)

var binPath string

// TestMain builds the real binary once.
func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "rl-tproxy-fault-")
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

// ---- credentials ----

func newCredential(t testing.TB, keyID uint32) credentials.Credential {
	t.Helper()
	return rlcluster.NewCredential(t, "fault", keyID)
}

func writeFile(t testing.TB, path, body string) string {
	t.Helper()
	return bintest.WriteFile(t, path, body, 0o600)
}

// ---- child processes ----

// proc is a child process whose stderr is collected line by line.
type proc struct {
	t      testing.TB
	name   string
	cmd    *exec.Cmd
	mu     sync.Mutex
	raw    []string
	keep   bool // keep every line (false: keep only non-access lines)
	access map[string]int
	causes map[string]int
	status map[int]int
	accN   atomic.Int64
	onLine func(string)
	exited chan struct{}
}

func startProc(t testing.TB, name string, keep bool, args ...string) *proc {
	t.Helper()
	p := &proc{t: t, name: name, keep: keep, access: map[string]int{}, causes: map[string]int{}, status: map[int]int{}, exited: make(chan struct{})}
	p.cmd = exec.Command(binPath, args...)
	stderr, err := p.cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := p.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); p.scan(stderr) }()
	go func() { defer wg.Done(); p.scan(stdout) }()
	go func() {
		wg.Wait()
		_ = p.cmd.Wait()
		close(p.exited)
	}()
	t.Cleanup(func() {
		p.stop()
		if t.Failed() {
			p.mu.Lock()
			lines := p.raw
			if len(lines) > 200 {
				lines = lines[len(lines)-200:]
			}
			t.Logf("%s output (last %d lines):\n%s", p.name, len(lines), strings.Join(lines, "\n"))
			p.mu.Unlock()
		}
	})
	return p
}

func (p *proc) scan(r io.Reader) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		isAccess := strings.Contains(line, `"msg":"access"`)
		p.mu.Lock()
		if isAccess {
			var m struct {
				Outcome, Cause string
				Status         int
			}
			if json.Unmarshal([]byte(line), &m) == nil {
				p.access[m.Outcome]++
				p.causes[m.Cause]++
				p.status[m.Status]++
			}
		}
		if p.keep || !isAccess {
			p.raw = append(p.raw, line)
		}
		f := p.onLine
		p.mu.Unlock()
		if isAccess {
			p.accN.Add(1)
		}
		if f != nil {
			f(line)
		}
	}
}

// lines returns a copy of the collected output lines.
func (p *proc) lines() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.raw...)
}

// find returns the first submatch of re in the output ("" when absent).
func (p *proc) find(re *regexp.Regexp) string {
	for _, l := range p.lines() {
		if m := re.FindStringSubmatch(l); m != nil {
			return m[1]
		}
	}
	return ""
}

// counts returns copies of the access-log counters by outcome and cause.
func (p *proc) counts() (outcomes, causes map[string]int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	outcomes, causes = map[string]int{}, map[string]int{}
	for k, v := range p.access {
		outcomes[k] = v
	}
	for k, v := range p.causes {
		causes[k] = v
	}
	return outcomes, causes
}

func (p *proc) resetCounts() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.access, p.causes, p.status = map[string]int{}, map[string]int{}, map[int]int{}
}

func (p *proc) running() bool {
	select {
	case <-p.exited:
		return false
	default:
		return true
	}
}

// stop sends SIGTERM and waits (bounded), then SIGKILL.
func (p *proc) stop() {
	if !p.running() {
		return
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.exited:
	case <-time.After(10 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.exited
	}
}

// kill sends SIGKILL and waits for the exit.
func (p *proc) kill() {
	_ = p.cmd.Process.Kill()
	<-p.exited
}

// ---- RateLimitly cluster: three server processes behind DNS SRV ----
// (processes, not rlcluster.Start's in-process servers: the tests kill -9
// and restart them; credentials and SRV records come from rlcluster)

const (
	srvName   = "_ratelimitly._udp.rl.fault.test."
	srvDomain = "fault.test." // node i's SRV target is rlcluster.TargetName(srvDomain, i)
)

type node struct {
	ip    string
	port  uint16
	epoch uint64 // server_epoch from the "serving" line
	p     *proc
}

type cluster struct {
	t     testing.TB
	dns   *dnstest.Server
	cred  credentials.Credential
	creds string // server credentials file
	nodes []*node
}

var (
	servingRE = regexp.MustCompile(`msg=serving udp=(\S+)`)
	epochRE   = regexp.MustCompile(`msg=serving .*epoch_ms=(\d+)`)
)

// startServer runs `rl-tproxy ratelimitly-server` on ip:port (0 = any)
// and waits for its "serving" line.
func (c *cluster) startServer(ip string, port uint16) *node {
	c.t.Helper()
	n := &node{ip: ip}
	n.p = startProc(c.t, "ratelimitly-server "+ip, true, "ratelimitly-server",
		"--listen", fmt.Sprintf("%s:%d", ip, port), "--credentials", c.creds, "--admin", "127.0.0.1:0", "--workers", "1")
	var addr string
	testkit.WaitWithin(c.t, 30*time.Second, "ratelimitly-server "+ip+" serving", func() bool {
		if !n.p.running() {
			c.t.Fatalf("ratelimitly-server %s exited:\n%s", ip, strings.Join(n.p.lines(), "\n"))
		}
		addr = n.p.find(servingRE)
		return addr != ""
	})
	ap, err := netip.ParseAddrPort(addr)
	if err != nil {
		c.t.Fatalf("server address %q: %v", addr, err)
	}
	n.port = ap.Port()
	n.epoch, _ = strconv.ParseUint(n.p.find(epochRE), 10, 64)
	return n
}

func startCluster(t testing.TB) *cluster {
	t.Helper()
	c := &cluster{t: t, cred: newCredential(t, 21)}
	c.creds = writeFile(t, filepath.Join(t.TempDir(), "server-credentials.yaml"), rlcluster.CredentialYAML(c.cred))
	c.dns = dnstest.Start(t)
	var addrs []netip.AddrPort
	for i := 0; i < 3; i++ {
		n := c.startServer(fmt.Sprintf("127.0.0.%d", 2+i), 0)
		c.nodes = append(c.nodes, n)
		addrs = append(addrs, netip.AddrPortFrom(netip.MustParseAddr(n.ip), n.port))
	}
	c.dns.SetTTL(1, 1)
	c.dns.SetSRV(srvName, rlcluster.Targets(srvDomain, addrs...)...)
	return c
}

// restart starts node i again on the same address and port.
func (c *cluster) restart(i int) {
	c.t.Helper()
	old := c.nodes[i]
	c.nodes[i] = c.startServer(old.ip, old.port)
}

// ---- upstream ----

var bigBody = []byte(strings.Repeat("0123456789abcdef", 1<<14)) // 256 KiB

type upstream struct {
	addr string
	hits atomic.Int64
}

func startUpstream(t testing.TB) *upstream {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	u := &upstream{addr: ln.Addr().String()}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u.hits.Add(1)
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/plain")
		if strings.HasSuffix(r.URL.Path, "/big") { // a response larger than the socket buffers
			_, _ = w.Write(bigBody)
			return
		}
		fmt.Fprintf(w, "upstream %s %s\n", r.Method, r.URL.Path)
	})}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { srv.Close() })
	return u
}

// ---- the proxy ----

type policyOpts struct {
	fail     string // open | close
	unit     string // request policy unit
	creds    string // credentials file
	debug    bool
	upstream string
}

func freeAddr(t testing.TB) string {
	t.Helper()
	return testkit.FreeAddr(t)
}

// writePolicy writes a listener-mode policy: /open is unprotected, every
// other path needs an admission decision from a zone so large that
// RateLimitly always allows (any non-allow is a fault, not a limit).
func writePolicy(t testing.TB, dir string, c *cluster, o policyOpts) (path, listen string) {
	t.Helper()
	if o.unit == "" {
		o.unit = "250ms" // generous: the CI machine is shared
	}
	listen = freeAddr(t)
	body := fmt.Sprintf(`ratelimitly:
  srv: %s
  resolver: %s
  resolver_timeout: 1s
  credentials: %s
  request_policy: {name: standard, unit: %s}
  fail: %s
  debug: %v
zones:
  huge: {bucket: "fault:{header.x-key}", rate: 4000000000/s, burst: 4000000000}
services:
  - name: web
    listen: %s
    upstream: %s
    locations:
      - name: open
        match: {path_prefix: /open}
      - name: adm
        match: {path_prefix: /}
        limit: [huge]
`, srvName, c.dns.Addr(), o.creds, o.unit, o.fail, o.debug, listen, o.upstream)
	return writeFile(t, filepath.Join(dir, "policy.yaml"), body), listen
}

type proxyProc struct {
	*proc
	base  string // http://listen
	admin string // host:port
}

// startProxy runs `rl-tproxy run` with JSON logs and waits for /readyz.
func startProxy(t testing.TB, policy, listen, level string, keep bool) *proxyProc {
	t.Helper()
	p := &proxyProc{base: "http://" + listen, admin: freeAddr(t)}
	p.proc = startProc(t, "rl-tproxy run", keep, "run", "--policy", policy, "--admin", p.admin,
		"--log-format", "json", "--log-level", level, "--drain-timeout", "5s")
	testkit.WaitWithin(t, 30*time.Second, "/readyz 200", func() bool {
		if !p.running() {
			t.Fatalf("rl-tproxy exited:\n%s", strings.Join(p.lines(), "\n"))
		}
		resp, err := http.Get("http://" + p.admin + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == 200
	})
	return p
}

// scrapeClient opens a new connection per scrape, so scraping leaves no
// idle admin connection (and goroutine) behind in the proxy.
var scrapeClient = &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 30 * time.Second}

func (p *proxyProc) scrape() string {
	p.t.Helper()
	resp, err := scrapeClient.Get("http://" + p.admin + "/metrics")
	if err != nil {
		p.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		p.t.Fatal(err)
	}
	return string(b)
}

// metric returns the value of one exact series from /metrics (0 when absent).
func (p *proxyProc) metric(series string) float64 {
	p.t.Helper()
	return seriesValue(p.scrape(), series)
}

func seriesValue(body, series string) float64 {
	for _, l := range strings.Split(body, "\n") {
		if rest, ok := strings.CutPrefix(l, series+" "); ok {
			var v float64
			fmt.Sscan(rest, &v)
			return v
		}
	}
	return 0
}

func (p *proxyProc) pid() int { return p.cmd.Process.Pid }

// ---- HTTP load ----

// load sends n GET requests with conc keep-alive clients and returns the
// statuses seen (-1 for transport errors).
func load(t testing.TB, url string, n, conc int, stop *atomic.Bool) map[int]int {
	t.Helper()
	tr := &http.Transport{MaxIdleConnsPerHost: conc, DisableCompression: true}
	defer tr.CloseIdleConnections()
	cl := &http.Client{Transport: tr, Timeout: 30 * time.Second}
	var next atomic.Int64
	var mu sync.Mutex
	out := map[int]int{}
	var wg sync.WaitGroup
	for w := 0; w < conc; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			local := map[int]int{}
			for next.Add(1) <= int64(n) && (stop == nil || !stop.Load()) {
				req, _ := http.NewRequest("GET", url, nil)
				req.Header.Set("X-Key", "load")
				resp, err := cl.Do(req)
				if err != nil {
					local[-1]++
					continue
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				local[resp.StatusCode]++
			}
			mu.Lock()
			for k, v := range local {
				out[k] += v
			}
			mu.Unlock()
		}()
	}
	wg.Wait()
	return out
}
