package deploy

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"

	"github.com/rl-tproxy/rl-tproxy/internal/bintest"
	"github.com/rl-tproxy/rl-tproxy/internal/netnstest"
	"github.com/rl-tproxy/rl-tproxy/internal/testkit"
)

// TestDeployedCommandLines runs the real rl-tproxy binary the way the two
// deployments start it: the DaemonSet's args and the systemd unit's
// ExecStart (only the policy path swapped for a test policy), as root with
// exactly the granted capabilities and no_new_privs, in a "node" network
// namespace with bpffs on /sys/fs/bpf (a private mount namespace, like the
// host's), steering port 80 in front of an unchanged HTTP service. It
// checks what docs/operations.md promises: steering and admission work with
// those capabilities, /healthz and /readyz answer on the admin address, a
// killed proxy leaves the service answering (fall-through, nothing
// refused), the next proxy takes over from the pins, `redirect status`
// works with the same capabilities, and SIGTERM drains and exits 0.
func TestDeployedCommandLines(t *testing.T) {
	n := newNode(t)
	p, bin, mnt, caps, start, svcURL := n.pair, n.bin, n.mnt, n.caps, n.start, n.svcURL
	dsArgs := deployedArgs(t, n.policy)
	unitArgs := unitArgs(t, n.policy)

	// 1. The DaemonSet's command line.
	first := start(dsArgs)
	first.waitFor(t, "rl-tproxy running")
	for _, path := range []string{"/healthz", "/readyz"} {
		if code, body := get(t, p.Node, "http://127.0.0.1:9901"+path); code != 200 {
			t.Fatalf("%s on the DaemonSet's admin address: %d %s", path, code, body)
		}
	}
	for i := 1; i <= 3; i++ {
		if code, body := get(t, p.Client, svcURL); code != 200 || !strings.Contains(body, "xff="+p.ClientIP4.String()) {
			t.Fatalf("request %d through the proxy: %d %q (want 200 with the proxy's X-Forwarded-For)", i, code, body)
		}
	}
	if code, body := get(t, p.Client, svcURL); code != 429 {
		t.Fatalf("4th request: %d %q, want 429 (burst 3)", code, body)
	}

	// 2. kill -9: the service answers directly; nothing is refused.
	first.kill(t)
	for i := 0; i < 3; i++ {
		if code, body := get(t, p.Client, svcURL); code != 200 || !strings.Contains(body, "xff=-") {
			t.Fatalf("proxy dead: %d %q, want 200 straight from the service", code, body)
		}
	}

	// 3. The systemd unit's command line takes over from the pins.
	second := start(unitArgs)
	second.waitFor(t, "rl-tproxy running")
	if code, body := get(t, p.Node, "http://127.0.0.1:9901/readyz"); code != 200 {
		t.Fatalf("/readyz on the unit's default admin address: %d %s", code, body)
	}
	if code, body := get(t, p.Client, svcURL); code != 200 || !strings.Contains(body, "xff="+p.ClientIP4.String()) {
		t.Fatalf("after restart: %d %q, want steering through the new proxy", code, body)
	}
	status := exec.Command("nsenter", "--mount="+mnt, "--net="+p.Node.Path(), "--",
		"setpriv", "--no-new-privs", "--bounding-set="+caps, "--inh-caps=-all", "--", bin, "redirect", "status")
	out, err := status.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "ipv4 listener:   listener present") ||
		!strings.Contains(string(out), "matches this binary: yes") || !strings.Contains(string(out), "steered ports:   80") {
		t.Fatalf("redirect status with the granted capabilities: %v\n%s", err, out)
	}

	// 4. SIGTERM: drain and exit 0; the service keeps answering.
	if code := second.term(t); code != 0 {
		t.Fatalf("SIGTERM: exit %d, want 0\n%s", code, second.logTail())
	}
	if code, body := get(t, p.Client, svcURL); code != 200 || !strings.Contains(body, "xff=-") {
		t.Fatalf("after stop: %d %q, want 200 straight from the service", code, body)
	}
}

// TestRollingUpdateOverlap is what the DaemonSet's rolling update
// (maxSurge 1, maxUnavailable 0) does on one node: a second pod starts with
// the same args while the first still runs. The second must take over
// (requests keep going through a proxy), and the first must drain and exit
// 0 on SIGTERM while the second keeps steering.
func TestRollingUpdateOverlap(t *testing.T) {
	n := newNode(t)
	args := deployedArgs(t, n.policy)
	first := n.start(args)
	first.waitFor(t, "rl-tproxy running")
	if code, body := get(t, n.pair.Client, n.svcURL); code != 200 || !strings.Contains(body, "xff="+n.pair.ClientIP4.String()) {
		t.Fatalf("through the first proxy: %d %q", code, body)
	}
	second := n.start(args)
	second.waitFor(t, "rl-tproxy running")
	if code, body := get(t, n.pair.Client, n.svcURL); code != 200 || !strings.Contains(body, "xff="+n.pair.ClientIP4.String()) {
		t.Fatalf("after the second proxy started: %d %q, want steering through a proxy", code, body)
	}
	if code := first.term(t); code != 0 {
		t.Fatalf("old pod SIGTERM: exit %d\n%s", code, first.logTail())
	}
	if code, body := get(t, n.pair.Client, n.svcURL); code != 200 || !strings.Contains(body, "xff="+n.pair.ClientIP4.String()) {
		t.Fatalf("after the old proxy stopped: %d %q, want steering through the new proxy", code, body)
	}
	if code, body := get(t, n.pair.Node, "http://127.0.0.1:9901/readyz"); code != 200 {
		t.Fatalf("new proxy /readyz: %d %s", code, body)
	}
}

// node is a "node" namespace with an unchanged service on port 80, a
// client namespace, a bpffs mount namespace and the built binary, started
// with exactly the deployments' capabilities.
type node struct {
	t      *testing.T
	pair   *netnstest.Pair
	bin    string
	mnt    string
	caps   string
	policy string
	svcURL string
}

func newNode(t *testing.T) *node {
	t.Helper()
	testkit.NeedRoot(t, "network and mount namespaces, bpffs, eBPF")
	for _, tool := range []string{"unshare", "nsenter", "setpriv"} {
		testkit.NeedTool(t, tool, "util-linux")
	}
	testkit.NeedTool(t, "ip", "iproute2")
	n := &node{t: t, bin: builtBinary(t), caps: "-all"}
	for _, c := range wantCaps {
		n.caps += ",+" + strings.ToLower(c)
	}
	n.pair = netnstest.NewPair(t)
	startUpstream(t, n.pair.Node)
	n.policy = filepath.Join(t.TempDir(), "policy.yaml")
	if err := os.WriteFile(n.policy, []byte(e2ePolicy), 0o644); err != nil {
		t.Fatal(err)
	}
	n.mnt = testkit.HoldBPFFS(t)
	n.svcURL = fmt.Sprintf("http://%s/", net.JoinHostPort(n.pair.NodeIP4.String(), "80"))
	return n
}

// start runs the binary with args in the node's network and mount
// namespaces as root with only the granted capabilities and no_new_privs.
func (n *node) start(args []string) *proxyProc {
	return startProxy(n.t, exec.Command("nsenter", append([]string{"--mount=" + n.mnt, "--net=" + n.pair.Node.Path(), "--",
		"setpriv", "--no-new-privs", "--bounding-set=" + n.caps, "--inh-caps=-all", "--", n.bin}, args...)...))
}

var (
	buildMu  sync.Mutex
	buildDir string
	buildErr error
)

// builtBinary builds cmd/rl-tproxy once per test process.
func builtBinary(t *testing.T) string {
	t.Helper()
	buildMu.Lock()
	defer buildMu.Unlock()
	if buildDir == "" && buildErr == nil {
		testkit.NeedTool(t, "go", "golang-go")
		dir, err := os.MkdirTemp("", "rl-tproxy-deploy-bin-")
		if err != nil {
			t.Fatal(err)
		}
		_, buildErr = bintest.Build(dir)
		buildDir = dir
	}
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return filepath.Join(buildDir, "rl-tproxy")
}

const e2ePolicy = `ratelimitly:
  embedded: true
  request_policy: {name: standard, unit: 20ms}
  fail: close
zones:
  per_client: {bucket: "client:{remote_addr}", rate: 1/h, burst: 3}
services:
  - name: web
    port: 80
    upstream: 127.0.0.1:80
    forwarded_headers: {x_forwarded_for: true}
    locations:
      - name: all
        match: {path_prefix: /}
        limit: [per_client]
`

// deployedArgs is the DaemonSet container's args with --policy replaced.
func deployedArgs(t *testing.T, policy string) []string {
	t.Helper()
	ds := only[*appsv1.DaemonSet](t, loadManifests(t))
	var args []string
	for _, a := range ctr(ds).Args {
		if strings.HasPrefix(a, "--policy=") {
			a = "--policy=" + policy
		}
		args = append(args, a)
	}
	return args
}

// unitArgs is the systemd unit's ExecStart arguments with --policy's value
// replaced.
func unitArgs(t *testing.T, policy string) []string {
	t.Helper()
	exec := unitSettings(readFile(t, unitFile))["Service.ExecStart"]
	if len(exec) != 1 {
		t.Fatalf("ExecStart: %q", exec)
	}
	f := strings.Fields(exec[0])[1:]
	for i := range f {
		if i > 0 && f[i-1] == "--policy" {
			f[i] = policy
		}
	}
	return f
}

// startUpstream serves HTTP on :80 in ns, answering with the
// X-Forwarded-For it received ("-" when none: a direct connection).
func startUpstream(t *testing.T, ns *netnstest.NS) {
	t.Helper()
	var ln net.Listener
	if err := ns.Do(func() error {
		var err error
		ln, err = net.Listen("tcp", ":80")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		xff := r.Header.Get("X-Forwarded-For")
		if xff == "" {
			xff = "-"
		}
		fmt.Fprintf(w, "upstream xff=%s\n", xff)
	})}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
}

// get makes one GET on a new connection dialled from inside ns (dialled
// synchronously: net/http's Transport would dial on another OS thread,
// outside the namespace).
func get(t *testing.T, ns *netnstest.NS, rawURL string) (int, string) {
	t.Helper()
	u, err := url.Parse(rawURL)
	if err != nil {
		t.Fatal(err)
	}
	var conn net.Conn
	if err := ns.Do(func() error {
		var err error
		conn, err = net.DialTimeout("tcp", u.Host, 10*time.Second)
		return err
	}); err != nil {
		t.Fatalf("GET %s: %v", rawURL, err)
	}
	defer conn.Close()
	if err := conn.SetDeadline(time.Now().Add(10 * time.Second)); err != nil {
		t.Fatal(err)
	}
	if _, err := fmt.Fprintf(conn, "GET %s HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n", u.RequestURI(), u.Host); err != nil {
		t.Fatalf("GET %s: %v", rawURL, err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("GET %s: %v", rawURL, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("GET %s: body: %v", rawURL, err)
	}
	return resp.StatusCode, string(b)
}

// proxyProc is a running rl-tproxy whose JSON log lines are collected.
type proxyProc struct {
	cmd   *exec.Cmd
	lines chan string
	log   []string
}

func startProxy(t *testing.T, cmd *exec.Cmd) *proxyProc {
	t.Helper()
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start rl-tproxy: %v", err)
	}
	p := &proxyProc{cmd: cmd, lines: make(chan string, 1024)}
	go func() {
		defer close(p.lines)
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			p.lines <- sc.Text()
		}
	}()
	t.Cleanup(func() {
		if p.cmd.ProcessState == nil {
			_ = p.cmd.Process.Kill()
			p.drain()
			_ = p.cmd.Wait()
		}
	})
	return p
}

// waitFor reads log lines until one has msg, failing on exit or after a
// bound.
func (p *proxyProc) waitFor(t *testing.T, msg string) {
	t.Helper()
	deadline := time.After(60 * time.Second)
	for {
		select {
		case line, ok := <-p.lines:
			if !ok {
				_ = p.cmd.Wait()
				t.Fatalf("rl-tproxy exited before %q: %v\n%s", msg, p.cmd.ProcessState, p.logTail())
			}
			p.log = append(p.log, line)
			var rec struct {
				Msg string `json:"msg"`
			}
			if json.Unmarshal([]byte(line), &rec) != nil {
				t.Fatalf("log line is not JSON (--log-format json): %q", line)
			}
			if rec.Msg == msg {
				return
			}
		case <-deadline:
			t.Fatalf("no %q log line within 60s\n%s", msg, p.logTail())
		}
	}
}

func (p *proxyProc) drain() {
	for line := range p.lines {
		p.log = append(p.log, line)
	}
}

func (p *proxyProc) logTail() string {
	n := len(p.log)
	if n > 30 {
		n = 30
	}
	return strings.Join(p.log[len(p.log)-n:], "\n")
}

func (p *proxyProc) kill(t *testing.T) {
	t.Helper()
	if err := p.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	p.drain()
	_ = p.cmd.Wait()
}

// term sends SIGTERM and returns the exit code; the drain is bounded by
// --drain-timeout, the wait here by a context.
func (p *proxyProc) term(t *testing.T) int {
	t.Helper()
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	exited := make(chan struct{})
	go func() {
		p.drain()
		_ = p.cmd.Wait()
		close(exited)
	}()
	select {
	case <-exited:
	case <-ctx.Done():
		_ = p.cmd.Process.Kill()
		<-exited
		t.Fatalf("rl-tproxy did not exit within 60s of SIGTERM\n%s", p.logTail())
	}
	return p.cmd.ProcessState.ExitCode()
}
