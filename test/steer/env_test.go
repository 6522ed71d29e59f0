package steer

import (
	"bufio"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/rl-tproxy/rl-tproxy/internal/dnstest"
	"github.com/rl-tproxy/rl-tproxy/internal/netnstest"
	"github.com/rl-tproxy/rl-tproxy/internal/testkit"
)

const (
	srvName   = "_ratelimitly._udp.rl.steer.test."
	rlPort    = 7946 // every RateLimitly node listens on its own loopback address
	burst     = 5    // per client address on /limited/
	proxyName = "rl-tproxy"
)

// env is one test's world: the namespace pair, nginx on port 80 in the
// node namespace, the RateLimitly cluster behind dnsmasq, and a policy
// that steers port 80.
type env struct {
	t                *testing.T
	pair             *netnstest.Pair
	mnt              string // mount namespace holding the bpffs the proxies share
	dir              string
	v6               bool
	nodeIP, clientIP netip.Addr
	nginxLog         string
	nginx            *proc
	servers          []*proc
	dns              *dnstest.Dnsmasq
	policy           string
}

// newEnv builds the world for the IPv4 (v6 false) or IPv6 variant.
func newEnv(t *testing.T, v6 bool) *env {
	t.Helper()
	netnstest.Require(t)
	for _, tool := range [][2]string{{"nsenter", "util-linux"}, {"unshare", "util-linux"}, {"nginx", "nginx"},
		{"curl", "curl"}, {"wrk", "wrk"}, {"dnsmasq", "dnsmasq-base"}} {
		testkit.NeedTool(t, tool[0], tool[1])
	}
	e := &env{t: t, dir: t.TempDir(), v6: v6}
	e.pair = netnstest.NewPair(t)
	// Runs before the namespaces are deleted (cleanups run last-in first
	// out): kill anything of ours still running inside them.
	t.Cleanup(func() {
		for _, ns := range []*netnstest.NS{e.pair.Node, e.pair.Client} {
			out, err := exec.Command("ip", "netns", "pids", ns.Name).Output()
			if err != nil {
				continue
			}
			for _, f := range strings.Fields(string(out)) {
				if pid, err := strconv.Atoi(f); err == nil && pid > 1 {
					t.Logf("killing leftover pid %d in %s", pid, ns.Name)
					_ = syscall.Kill(pid, syscall.SIGKILL)
				}
			}
		}
	})
	e.nodeIP, e.clientIP = e.pair.NodeIP4, e.pair.ClientIP4
	if v6 {
		e.nodeIP, e.clientIP = e.pair.NodeIP6, e.pair.ClientIP6
	}
	e.mnt = testkit.HoldBPFFS(t)
	cred := e.writeCredentials()
	e.startCluster(cred)
	e.startNginx()
	e.policy = e.writePolicy(cred)
	return e
}

func (e *env) writeCredentials() string {
	var secret [32]byte
	if _, err := rand.Read(secret[:]); err != nil {
		e.t.Fatal(err)
	}
	p := filepath.Join(e.dir, "credentials.yaml")
	body := fmt.Sprintf("tenant: steer\nkey_id: 7\nsecret: %s\n", base64.StdEncoding.EncodeToString(secret[:]))
	if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
		e.t.Fatal(err)
	}
	return p
}

// inNode is a command for bin in the node network namespace and the
// shared bpffs mount namespace.
func (e *env) inNode(args ...string) *exec.Cmd {
	return exec.Command("nsenter", e.nodeArgs(args...)...)
}

// nodeArgs are nsenter's arguments for inNode.
func (e *env) nodeArgs(args ...string) []string {
	return append([]string{"--mount=" + e.mnt, "--net=" + e.pair.Node.Path(), "--", binPath}, args...)
}

// startCluster starts three `rl-tproxy ratelimitly-server` processes on
// 127.0.0.2-4 in the node namespace and dnsmasq there serving their SRV
// and A records.
func (e *env) startCluster(cred string) {
	t := e.t
	var targets []dnstest.Target
	for i := range 3 {
		ip := netip.AddrFrom4([4]byte{127, 0, 0, byte(2 + i)})
		p := startProc(t, fmt.Sprintf("ratelimitly-server %s", ip), e.inNode("ratelimitly-server",
			"--listen", netip.AddrPortFrom(ip, rlPort).String(), "--credentials", cred,
			"--admin", "127.0.0.1:0", "--workers", "1"))
		p.waitLine(t, "serving line", 0, func(l string) bool { return strings.Contains(l, "msg=serving") })
		e.servers = append(e.servers, p)
		targets = append(targets, dnstest.Target{Name: fmt.Sprintf("rl%d.steer.test.", i), Port: rlPort, Addrs: []netip.Addr{ip}})
	}
	// dnsmasq is started from a thread inside the node namespace, so it
	// listens on the node's loopback.
	if err := e.pair.Node.Do(func() error {
		e.dns = dnstest.StartDnsmasq(t, srvName, 5, targets...)
		return nil
	}); err != nil {
		t.Fatalf("dnsmasq in the node namespace: %v", err)
	}
}

// startNginx starts an unchanged nginx on port 80 (IPv4 and IPv6) in the
// node namespace. Its answer echoes the forwarded headers it received;
// its access log records them with the peer address.
func (e *env) startNginx() {
	t := e.t
	dir := filepath.Join(e.dir, "nginx")
	for _, d := range []string{"", "body", "proxy", "fastcgi", "uwsgi", "scgi"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	e.nginxLog = filepath.Join(dir, "access.log")
	pid := filepath.Join(dir, "nginx.pid")
	conf := filepath.Join(dir, "nginx.conf")
	body := fmt.Sprintf(`daemon off;
master_process on;
worker_processes 1;
user root;
pid %[1]s/nginx.pid;
error_log %[1]s/error.log info;
events { worker_connections 1024; }
http {
    client_body_temp_path %[1]s/body;
    proxy_temp_path %[1]s/proxy;
    fastcgi_temp_path %[1]s/fastcgi;
    uwsgi_temp_path %[1]s/uwsgi;
    scgi_temp_path %[1]s/scgi;
    default_type text/plain;
    log_format steer 'peer=$remote_addr uri=$request_uri status=$status xff="$http_x_forwarded_for" xrealip="$http_x_real_ip"';
    access_log %[1]s/access.log steer;
    server {
        listen 0.0.0.0:80 backlog=4096;
        listen [::]:80 ipv6only=on backlog=4096;
        location / {
            return 200 "nginx xff=$http_x_forwarded_for xrealip=$http_x_real_ip\n";
        }
    }
}
`, dir)
	if err := os.WriteFile(conf, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("ip", "netns", "exec", e.pair.Node.Name, "nginx", "-e", filepath.Join(dir, "error.log"), "-c", conf)
	e.nginx = startProc(t, "nginx", cmd)
	t.Cleanup(func() {
		// Graceful stop (workers included) before the kill cleanup.
		if !e.nginx.exited() {
			_ = e.nginx.cmd.Process.Signal(syscall.SIGTERM)
			e.nginx.waitExit(waitBound)
		}
	})
	// nginx opens its listening sockets before it writes the pid file.
	testkit.WaitWithin(t, waitBound, "nginx pid file", func() bool {
		if e.nginx.exited() {
			errLog, _ := os.ReadFile(filepath.Join(dir, "error.log"))
			t.Fatalf("nginx exited: %v\n%s\n%s", e.nginx.waitErr(), e.nginx.tail(20), errLog)
		}
		_, err := os.Stat(pid)
		return err == nil
	})
}

// writePolicy steers port 80 to nginx over the loopback address of the
// variant's family: /open/ is unprotected, /limited/ has a burst of 5 per
// client address (1 token a minute), /wrk/ the same in its own bucket,
// fail: close. The request policy's horizon (750ms) is generous so that a
// loaded machine does not turn decisions into timeouts.
func (e *env) writePolicy(cred string) string {
	upstream := "127.0.0.1:80"
	if e.v6 {
		upstream = "[::1]:80"
	}
	p := filepath.Join(e.dir, "policy.yaml")
	body := fmt.Sprintf(`ratelimitly:
  srv: %[1]s
  resolver: %[2]s
  credentials: %[3]s
  request_policy: {name: standard, unit: 250ms}
  fail: close
defaults:
  forwarded_headers: {x_forwarded_for: true, x_real_ip: true}
zones:
  per_client: {bucket: "steer:{remote_addr}", rate: 1/m, burst: %[4]d}
  per_client_wrk: {bucket: "wrk:{remote_addr}", rate: 1/m, burst: %[4]d}
services:
  - name: nginx
    port: 80
    upstream: "%[5]s"
    locations:
      - name: open
        match: {path_prefix: /open/}
      - name: limited
        match: {path_prefix: /limited/}
        limit: [per_client]
      - name: wrk
        match: {path: /wrk/}
        limit: [per_client_wrk]
`, srvName, e.dns.Addr, cred, burst, upstream)
	if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
		e.t.Fatal(err)
	}
	return p
}

// url is nginx's address as the client sees it.
func (e *env) url(path string) string {
	return "http://" + netip.AddrPortFrom(e.nodeIP, 80).String() + path
}

// proxy is a running `rl-tproxy run`.
type proxy struct {
	*proc
	admin string // admin listener address inside the node namespace

	cmu     sync.Mutex     // guards the countPath cache below
	scanned int            // lines already counted
	counts  map[string]int // access records by path
}

// startProxy starts `rl-tproxy run` in the node namespace and waits until
// its steered listeners are registered and /readyz answers 200
// (RateLimitly discovered, listeners in the sockmap).
func (e *env) startProxy(name string, extra ...string) *proxy {
	t := e.t
	args := append([]string{"run", "--policy", e.policy, "--admin", "127.0.0.1:0",
		"--log-format", "json", "--drain-timeout", "10s", "--watch=false"}, extra...)
	p := &proxy{proc: startProc(t, name, e.inNode(args...))}
	t.Cleanup(func() {
		if t.Failed() {
			var l []string
			for _, line := range p.snapshot() {
				if !msgIs("access")(line) {
					l = append(l, line)
				}
			}
			if len(l) > 40 {
				l = l[len(l)-40:]
			}
			t.Logf("%s output without access lines (last 40):\n%s", name, strings.Join(l, "\n"))
		}
	})
	line, _ := p.waitLine(t, `"admin listener" line`, 0, msgIs("admin listener"))
	var rec struct{ Addr string }
	if m := jsonLog([]string{line}); len(m) == 1 {
		rec.Addr, _ = m[0]["addr"].(string)
	}
	if rec.Addr == "" {
		t.Fatalf("%s: no addr in %q", name, line)
	}
	p.admin = rec.Addr
	if e.v6 {
		p.waitLine(t, "IPv6 steered listener", 0, func(l string) bool {
			return msgIs("steered listener registered")(l) && strings.Contains(l, `"addr":"[::1]:`)
		})
	}
	p.waitLine(t, `"rl-tproxy running"`, 0, msgIs("rl-tproxy running"))
	e.checkSteeredGroup(p)
	testkit.WaitWithin(t, waitBound, name+" /readyz 200", func() bool {
		if p.exited() {
			t.Fatalf("%s exited: %v\n%s", name, p.waitErr(), p.tail(40))
		}
		r, err := httpGet(e.pair.Node, p.admin, "/readyz", false)
		return err == nil && r.status == 200
	})
	return p
}

// access returns the proxy's access log records.
func (p *proxy) access() []map[string]any {
	var out []map[string]any
	for _, m := range jsonLog(p.snapshot()) {
		if m["msg"] == "access" {
			out = append(out, m)
		}
	}
	return out
}

// kill9 sends SIGKILL and waits for the process to be reaped.
func (p *proxy) kill9(t testing.TB) {
	t.Helper()
	if err := p.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if !p.waitExit(waitBound) {
		t.Fatalf("%s not reaped after SIGKILL", p.name)
	}
}

// response is what a raw HTTP/1.1 client saw.
type response struct {
	status int
	header http.Header
	body   string
}

// httpGet makes one GET on a new connection dialled from inside ns (the
// dial must happen on a thread in the namespace; net/http's Transport
// would dial on another one). closeConn asks for Connection: close.
func httpGet(ns *netnstest.NS, addr, path string, closeConn bool) (*response, error) {
	var c net.Conn
	if err := ns.Do(func() error {
		var err error
		c, err = net.DialTimeout("tcp", addr, 10*time.Second)
		return err
	}); err != nil {
		return nil, err
	}
	return roundTrip(c, addr, path, closeConn)
}

// roundTrip sends one GET on c, reads the whole answer and closes c.
func roundTrip(c net.Conn, host, path string, closeConn bool) (*response, error) {
	defer c.Close()
	if err := c.SetDeadline(time.Now().Add(20 * time.Second)); err != nil {
		return nil, err
	}
	conn := ""
	if closeConn {
		conn = "Connection: close\r\n"
	}
	if _, err := fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: %s\r\nUser-Agent: steer-test\r\n%s\r\n", path, host, conn); err != nil {
		return nil, err
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	return &response{status: resp.StatusCode, header: resp.Header, body: string(b)}, nil
}

// curl runs curl in the client namespace and parses its -i output.
func (e *env) curl(path string) *response {
	t := e.t
	t.Helper()
	out, err := runBounded(t, waitBound, "ip", "netns", "exec", e.pair.Client.Name,
		"curl", "-sS", "-i", "--max-time", "20", e.url(path))
	if err != nil {
		t.Fatalf("curl %s: %v", e.url(path), err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(strings.NewReader(string(out))), nil)
	if err != nil {
		t.Fatalf("curl %s: parse %q: %v", e.url(path), out, err)
	}
	b, _ := io.ReadAll(resp.Body)
	return &response{status: resp.StatusCode, header: resp.Header, body: string(b)}
}

// nginxLines returns nginx's access log lines.
func (e *env) nginxLines() []string {
	b, err := os.ReadFile(e.nginxLog)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		e.t.Fatal(err)
	}
	return strings.Split(strings.TrimRight(string(b), "\n"), "\n")
}

// countLines counts lines that contain every part.
func countLines(lines []string, parts ...string) int {
	n := 0
next:
	for _, l := range lines {
		for _, p := range parts {
			if !strings.Contains(l, p) {
				continue next
			}
		}
		n++
	}
	return n
}

// checkSteeredGroup checks that p's IPv4 steered listener is a reuseport
// group of one socket per event loop or CPU: its log line says so and ss,
// in the node namespace, lists that many listening sockets on its address.
func (e *env) checkSteeredGroup(p *proxy) {
	t := e.t
	t.Helper()
	line, _ := p.waitLine(t, "IPv4 steered listener", 0, func(l string) bool {
		return msgIs("steered listener registered")(l) && strings.Contains(l, `"addr":"127.0.0.1:`)
	})
	m := jsonLog([]string{line})
	if len(m) != 1 {
		t.Fatalf("%s: steered listener line %q", p.name, line)
	}
	addr, _ := m[0]["addr"].(string)
	n, _ := m[0]["sockets"].(float64)
	// One socket per event loop: run's --event-loops defaults to one
	// per CPU.
	want := runtime.GOMAXPROCS(0)
	if int(n) != want {
		t.Fatalf("%s: steered listener group of %v sockets, want one per event loop or CPU (%d): %q", p.name, m[0]["sockets"], want, line)
	}
	testkit.NeedTool(t, "ss", "iproute2")
	out, err := runBounded(t, waitBound, "ip", "netns", "exec", e.pair.Node.Name, "ss", "-Htln", "src", addr)
	if err != nil {
		t.Fatal(err)
	}
	var lines []string
	for _, l := range strings.Split(string(out), "\n") {
		if strings.Contains(l, addr) {
			lines = append(lines, l)
		}
	}
	if len(lines) != int(n) {
		t.Fatalf("%s: ss lists %d listening sockets on %s, want %d:\n%s", p.name, len(lines), addr, int(n), out)
	}
}
