package e2e

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/rl-tproxy/rl-tproxy/internal/netnstest"
	"github.com/rl-tproxy/rl-tproxy/internal/testkit"
)

// nsProc is an rl-tproxy started inside a network namespace.
type nsProc struct {
	cmd    *exec.Cmd
	mu     sync.Mutex
	out    bytes.Buffer
	exited chan struct{}
}

func (p *nsProc) log() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.out.String()
}

// startInNS runs argv inside ns, collecting its output, and stops it with
// SIGTERM (bounded) when the test ends.
func startInNS(t *testing.T, ns *netnstest.NS, argv ...string) *nsProc {
	t.Helper()
	p := &nsProc{cmd: ns.Command(context.Background(), argv[0], argv[1:]...), exited: make(chan struct{})}
	pr, err := p.cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	p.cmd.Stdout = os.Stdout
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	scanned := make(chan struct{})
	go func() {
		defer close(scanned)
		sc := bufio.NewScanner(pr)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			p.mu.Lock()
			p.out.WriteString(sc.Text() + "\n")
			p.mu.Unlock()
		}
	}()
	go func() {
		<-scanned
		_ = p.cmd.Wait()
		close(p.exited)
	}()
	t.Cleanup(func() {
		select {
		case <-p.exited:
		default:
			_ = p.cmd.Process.Signal(syscall.SIGTERM)
			select {
			case <-p.exited:
			case <-time.After(15 * time.Second):
				_ = p.cmd.Process.Kill()
				<-p.exited
			}
		}
		if t.Failed() {
			t.Logf("rl-tproxy log:\n%s", p.log())
		}
	})
	return p
}

// nsGet sends one GET to addr from inside ns and returns the status and
// body (status 0 when no answer came within 10s).
func nsGet(t *testing.T, ns *netnstest.NS, addr, path string) (int, string) {
	t.Helper()
	status, body := 0, ""
	err := ns.Do(func() error {
		c, err := net.DialTimeout("tcp", addr, 5*time.Second)
		if err != nil {
			return nil
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(10 * time.Second))
		fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", path)
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			return nil
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		status, body = resp.StatusCode, string(b)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return status, body
}

// nsUpstream serves "ok" on 127.0.0.1:8081 inside ns.
func nsUpstream(t *testing.T, ns *netnstest.NS) {
	t.Helper()
	var ln net.Listener
	if err := ns.Do(func() (err error) {
		ln, err = net.Listen("tcp", "127.0.0.1:8081")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok\n") }),
		ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { srv.Close() })
}

// `run` with a bind address the node does not have (yet) stays up: the
// protected location answers per `fail: close` (429), /readyz says why,
// and once the address is added to a dummy interface the client is
// created by the retry and requests are decided (200).
func TestUnbindableBindRecovers(t *testing.T) {
	testkit.NeedRoot(t, "network namespace with a dummy interface")
	testkit.NeedTool(t, "ip", "iproute2")
	ns := netnstest.New(t)
	nsUpstream(t, ns)
	policy := filepath.Join(t.TempDir(), "policy.yaml")
	body := "ratelimitly:\n  embedded: true\n  bind: 10.77.0.1\n  fail: close\nzones:\n  z: {bucket: all, rate: 1000/s}\n" +
		"services:\n  - name: web\n    listen: 127.0.0.1:8080\n    upstream: 127.0.0.1:8081\n    locations:\n      - name: all\n        limit: [z]\n"
	if err := os.WriteFile(policy, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	p := startInNS(t, ns, binPath, "run", "--policy", policy, "--admin", "127.0.0.1:9901", "--log-format", "json")
	testkit.WaitWithin(t, 40*time.Second, "/readyz answers", func() bool { s, _ := nsGet(t, ns, "127.0.0.1:9901", "/readyz"); return s != 0 })
	if s, b := nsGet(t, ns, "127.0.0.1:9901", "/readyz"); s != 503 || !strings.Contains(b, "fail ratelimitly: RateLimitly client not created (retrying)") {
		t.Fatalf("/readyz %d %q; want 503 naming the client", s, b)
	}
	if s, _ := nsGet(t, ns, "127.0.0.1:8080", "/x"); s != 429 {
		t.Fatalf("protected request without a client: %d, want 429 (fail: close)", s)
	}
	select {
	case <-p.exited:
		t.Fatal("run exited")
	default:
	}
	dev := "dummy0"
	if err := ns.IP("link", "add", dev, "type", "dummy"); err != nil {
		// A kernel without the dummy module: the address appears on the
		// namespace's loopback instead, the same event for the proxy.
		t.Logf("no dummy interface (%v); adding the address to lo", err)
		dev = "lo"
	}
	ns.MustIP(t, "addr", "add", "10.77.0.1/32", "dev", dev)
	ns.MustIP(t, "link", "set", dev, "up")
	testkit.WaitWithin(t, 40*time.Second, "/readyz 200 after the address appeared", func() bool {
		s, _ := nsGet(t, ns, "127.0.0.1:9901", "/readyz")
		return s == 200
	})
	if s, b := nsGet(t, ns, "127.0.0.1:8080", "/x"); s != 200 || b != "ok\n" {
		t.Fatalf("after recovery: %d %q", s, b)
	}
	if !strings.Contains(p.log(), "RateLimitly client created after retrying") {
		t.Fatal("no recovery line in the log")
	}
}

// 5,000 idle connections to the admin listener of a proxy whose fd limit
// is 256 do not stop the data path from accepting and answering: the
// admin listener holds at most 64 of them, the rest wait in the kernel's
// accept queue.
func TestAdminFloodLeavesDataPath(t *testing.T) {
	testkit.NeedRoot(t, "network namespace with its own somaxconn")
	testkit.NeedTool(t, "ip", "iproute2")
	prlimit := testkit.NeedTool(t, "prlimit", "util-linux")
	ns := netnstest.New(t)
	// somaxconn is per network namespace: room for every flood connection
	// in the admin listener's accept queue.
	if out, err := ns.Command(context.Background(), "sysctl", "-w", "net.core.somaxconn=8192").CombinedOutput(); err != nil {
		t.Fatalf("sysctl: %v: %s", err, out)
	}
	nsUpstream(t, ns)
	policy := filepath.Join(t.TempDir(), "policy.yaml")
	body := "ratelimitly:\n  embedded: true\nservices:\n  - name: web\n    listen: 127.0.0.1:8080\n    upstream: 127.0.0.1:8081\n"
	if err := os.WriteFile(policy, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	startInNS(t, ns, prlimit, "--nofile=256:256", binPath, "run", "--policy", policy, "--admin", "127.0.0.1:9901", "--log-format", "json")
	testkit.WaitWithin(t, 40*time.Second, "/readyz 200", func() bool { s, _ := nsGet(t, ns, "127.0.0.1:9901", "/readyz"); return s == 200 })

	const flood = 5000
	var conns []net.Conn
	t.Cleanup(func() {
		for _, c := range conns {
			c.Close()
		}
	})
	if err := ns.Do(func() error {
		for range flood {
			c, err := net.DialTimeout("tcp", "127.0.0.1:9901", 5*time.Second)
			if err != nil {
				return fmt.Errorf("admin connection %d: %w", len(conns)+1, err)
			}
			conns = append(conns, c)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		if s, b := nsGet(t, ns, "127.0.0.1:8080", "/x"); s != 200 || b != "ok\n" {
			t.Fatalf("data path request %d with %d idle admin connections: %d %q", i, len(conns), s, b)
		}
	}
}

// A running proxy whose credentials file is replaced by a FIFO: the
// reload is rejected at once with an error naming the path (nothing
// blocks on the FIFO), the old policy keeps serving, and SIGTERM ends the
// process with exit 0.
func TestRunCredentialsBecomeFIFOThenTerm(t *testing.T) {
	c := startCluster(t)
	e := newEnv(t, c, policyOpts{})
	cred := filepath.Join(e.dir, "credentials.yaml")
	if _, err := os.Stat(cred); err != nil {
		t.Fatalf("the e2e policy's credentials file: %v", err)
	}
	if err := os.Remove(cred); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mkfifo(cred, 0o600); err != nil {
		t.Fatal(err)
	}
	e.p.signal(syscall.SIGHUP)
	testkit.WaitFor(t, "the reload rejected with the FIFO named", func() bool {
		for _, m := range e.p.snapshot() {
			if m["msg"] == "policy reload rejected" && strings.Contains(fmt.Sprint(m["error"]), cred+" is a named pipe (FIFO)") {
				return true
			}
		}
		return false
	})
	if r := e.get(t, "/probe"); r.status != 200 {
		t.Fatalf("after the rejected reload: %d", r.status)
	}
	e.p.signal(syscall.SIGTERM)
	select {
	case <-e.p.exited:
	case <-time.After(15 * time.Second):
		t.Fatal("SIGTERM did not end the process")
	}
	if e.p.exitCode != 0 {
		t.Fatalf("exit %d", e.p.exitCode)
	}
}
