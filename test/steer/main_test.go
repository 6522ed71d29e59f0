// Package steer runs end-to-end tests of sk_lookup steering with a real
// nginx: a "node" network namespace runs an unchanged nginx on port 80, a
// 3-node RateLimitly cluster (`rl-tproxy ratelimitly-server`) found through
// dnsmasq SRV records, and the real `rl-tproxy run` binary steering port
// 80; a "client" namespace joined by a veth pair sends curl, wrk and Go
// client traffic to nginx's address. The tests check admission (200 then
// 429), forwarded headers in nginx's access log, the absence of request
// loops, kill -9 fall-through, restart and takeover without refused
// connections, for IPv4 and IPv6.
//
// Everything needs root, eBPF, nsenter/unshare, nginx, curl, wrk and
// dnsmasq; each test skips with the reason when something is missing, or
// fails under RL_TPROXY_STRICT=1 (internal/testkit).
package steer

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/rl-tproxy/rl-tproxy/internal/bintest"
)

// binPath is the rl-tproxy binary built by TestMain.
var binPath string

func TestMain(m *testing.M) {
	if os.Getenv(foreignEnv) != "" {
		if err := installForeignProgram(); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
		os.Exit(0)
	}
	dir, err := os.MkdirTemp("", "rl-tproxy-steer-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binPath, err = bintest.Build(dir)
	if err != nil {
		fmt.Fprintln(os.Stderr, "build rl-tproxy:", err)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// Bounds for polling observable state. Generous: the CI machine has two
// cores shared with other jobs.
const (
	waitBound = 60 * time.Second
	pollEvery = 10 * time.Millisecond
)

// proc is a child process whose stdout and stderr lines are collected.
type proc struct {
	name string
	cmd  *exec.Cmd
	done chan struct{} // closed once the process was reaped

	mu    sync.Mutex
	lines []string
	err   error // Wait's result, valid after done
}

// startProc starts cmd, collects its output and kills it (bounded) when
// the test ends if it is still running.
func startProc(t testing.TB, name string, cmd *exec.Cmd) *proc {
	t.Helper()
	pr, pw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = pw, pw
	if err := cmd.Start(); err != nil {
		pr.Close()
		pw.Close()
		t.Fatalf("start %s: %v", name, err)
	}
	pw.Close()
	p := &proc{name: name, cmd: cmd, done: make(chan struct{})}
	scanned := make(chan struct{})
	go func() {
		defer close(scanned)
		sc := bufio.NewScanner(pr)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			p.mu.Lock()
			p.lines = append(p.lines, sc.Text())
			p.mu.Unlock()
		}
		_, _ = io.Copy(io.Discard, pr) // a line over 1 MiB: keep draining
	}()
	go func() {
		err := cmd.Wait()
		p.mu.Lock()
		p.err = err
		p.mu.Unlock()
		// done means "exited and its output read": a test that sees it
		// looks for the process's last lines, so the reader must have
		// finished first. Children (nginx workers) may hold the pipe; the
		// reader ends when they do, so wait for it only up to a bound.
		select {
		case <-scanned:
		case <-time.After(waitBound):
		}
		close(p.done)
		pr.Close()
	}()
	t.Cleanup(func() {
		if p.exited() {
			return
		}
		_ = cmd.Process.Signal(syscall.SIGKILL)
		select {
		case <-p.done:
		case <-time.After(waitBound):
			t.Errorf("%s (pid %d) did not exit after SIGKILL", name, cmd.Process.Pid)
		}
	})
	return p
}

func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// snapshot returns a copy of the lines so far.
func (p *proc) snapshot() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.lines...)
}

// tail is the last n lines, for failure messages.
func (p *proc) tail(n int) string {
	l := p.snapshot()
	if len(l) > n {
		l = l[len(l)-n:]
	}
	return strings.Join(l, "\n")
}

// waitLine waits for the first line (from line index from on) that match
// accepts and returns it with its index; the test fails if the process
// exits first or after waitBound.
func (p *proc) waitLine(t testing.TB, what string, from int, match func(string) bool) (string, int) {
	t.Helper()
	deadline := time.Now().Add(waitBound)
	for {
		exited := p.exited() // before reading: lines are complete once exited
		lines := p.snapshot()
		for i := from; i < len(lines); i++ {
			if match(lines[i]) {
				return lines[i], i
			}
		}
		if exited {
			t.Fatalf("%s exited (%v) before %s; output:\n%s", p.name, p.waitErr(), what, p.tail(40))
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: no %s within %v; output:\n%s", p.name, what, waitBound, p.tail(40))
		}
		time.Sleep(pollEvery)
	}
}

func (p *proc) waitErr() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.err
}

// waitExit waits up to bound for the process to exit and reports whether
// it did.
func (p *proc) waitExit(bound time.Duration) bool {
	select {
	case <-p.done:
		return true
	case <-time.After(bound):
		return false
	}
}

// jsonLog decodes the JSON log lines (rl-tproxy run --log-format json).
func jsonLog(lines []string) []map[string]any {
	var out []map[string]any
	for _, l := range lines {
		var m map[string]any
		if json.Unmarshal([]byte(l), &m) == nil {
			out = append(out, m)
		}
	}
	return out
}

// msgIs matches a JSON log line by its msg.
func msgIs(msg string) func(string) bool {
	return func(line string) bool {
		var m struct {
			Msg string `json:"msg"`
		}
		return json.Unmarshal([]byte(line), &m) == nil && m.Msg == msg
	}
}

// runBounded runs cmd with a deadline and returns its stdout.
func runBounded(t testing.TB, bound time.Duration, name string, args ...string) ([]byte, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), bound)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return out, fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, stderr.String())
	}
	return out, nil
}
