package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/rl-tproxy/rl-tproxy/internal/netnstest"
	"github.com/rl-tproxy/rl-tproxy/internal/testkit"
)

// Steered mode through the real binary: a client namespace connects to the
// node's service address; sk_lookup steers the connection to the proxy,
// which admits or denies and forwards to the unchanged service on the same
// port through the bypass dialer (no loop). When the proxy exits, the
// service keeps serving directly.
func TestSteeredMode(t *testing.T) {
	netnstest.Require(t)
	testkit.NeedTool(t, "curl", "curl")
	pair := netnstest.NewPair(t)
	const port = 8080
	var hits atomic.Int64
	var ln net.Listener
	if err := pair.Node.Do(func() error {
		var err error
		ln, err = net.Listen("tcp", fmt.Sprintf("0.0.0.0:%d", port))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		fmt.Fprintf(w, "service %s\n", r.URL.Path)
	})}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { srv.Close() })

	dir := t.TempDir()
	policy := filepath.Join(dir, "policy.yaml")
	body := fmt.Sprintf(`ratelimitly:
  embedded: true
  request_policy: {name: standard, unit: 250ms}
  fail: close
zones:
  z: {bucket: "c:{remote_addr}", rate: 5/m, burst: 2}
services:
  - name: web
    port: %d
    upstream: 127.0.0.1:%d
    locations:
      - name: all
        limit: [z]
`, port, port)
	if err := os.WriteFile(policy, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := pair.Node.Command(context.Background(), binPath, "run", "--policy", policy, "--admin", "127.0.0.1:0", "--log-format", "json", "--drain-timeout", "5s")
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var lines []string
	var access []map[string]any
	scanned := make(chan struct{})
	go func() {
		defer close(scanned)
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			var m map[string]any
			mu.Lock()
			lines = append(lines, sc.Text())
			if json.Unmarshal(sc.Bytes(), &m) == nil && m["msg"] == "access" {
				access = append(access, m)
			}
			mu.Unlock()
		}
	}()
	exited := make(chan error, 1)
	go func() { <-scanned; exited <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
		}
		// Remove the pinned program, link and maps of this namespace.
		out, err := pair.Node.Command(context.Background(), binPath, "redirect", "detach").CombinedOutput()
		if err != nil {
			t.Logf("redirect detach: %v: %s", err, out)
		}
		if t.Failed() {
			mu.Lock()
			t.Logf("proxy log:\n%s", strings.Join(lines, "\n"))
			mu.Unlock()
		}
	})
	registered := func() bool {
		mu.Lock()
		defer mu.Unlock()
		for _, l := range lines {
			if strings.Contains(l, `"steered listener registered"`) {
				return true
			}
		}
		select {
		case err := <-exited:
			t.Fatalf("proxy exited: %v\n%s", err, strings.Join(lines, "\n"))
		default:
		}
		return false
	}
	testkit.WaitFor(t, "steered listener registered", registered)
	url := fmt.Sprintf("http://%s:%d/x", pair.NodeIP4, port)
	status := func() int {
		out, err := pair.Client.Command(context.Background(), "curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", "--max-time", "10", url).Output()
		if err != nil {
			t.Fatalf("curl: %v", err)
		}
		var code int
		fmt.Sscan(string(out), &code)
		return code
	}
	// Discovery of the embedded server is asynchronous: until it is done,
	// fail: close answers 429 (no_endpoints). Wait for the first 200.
	testkit.WaitFor(t, "first admitted request", func() bool { return status() == 200 })
	got := []int{status(), status()}
	if got[0] != 200 || got[1] != 429 {
		t.Fatalf("statuses after the first allow %v, want [200 429] (burst 2)", got)
	}
	mu.Lock()
	last := access[len(access)-1]
	mu.Unlock()
	if last["service"] != "web" || last["outcome"] != "deny" || !strings.HasPrefix(fmt.Sprint(last["remote"]), pair.ClientIP4.String()+":") {
		t.Fatalf("access line %v", last)
	}
	before := hits.Load()
	// The proxy goes away: the service answers directly (no more 429s).
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-exited:
		if err != nil {
			t.Fatalf("proxy exit: %v", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("proxy did not exit after SIGTERM")
	}
	exited <- nil // for the cleanup
	for i := 0; i < 3; i++ {
		if s := status(); s != 200 {
			t.Fatalf("after the proxy exited: %d", s)
		}
	}
	if hits.Load() != before+3 {
		t.Fatalf("service hits %d, want %d", hits.Load(), before+3)
	}
}
