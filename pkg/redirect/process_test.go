package redirect

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/rl-tproxy/rl-tproxy/internal/netnstest"
)

// TestMain lets the test binary act as a minimal proxy process (see
// helperProxy) so tests can kill -9 a real process holding the redirect.
func TestMain(m *testing.M) {
	switch os.Getenv("RLTP_REDIRECT_HELPER") {
	case "1":
		os.Exit(helperProxy())
	case "caps":
		if err := capsProbe(os.Getenv("RLTP_PIN_ROOT"), os.Getenv("RLTP_UPSTREAM")); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(3)
		}
		fmt.Println("caps ok")
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// helperProxy attaches (reusing pins), registers a loopback listener, answers
// every connection with "NAME local-addr", prints "ready", then answers
// "registered?" lines on stdin until stdin closes, drains its accept
// queues and exits. With RLTP_GROUP=n it listens with a SO_REUSEPORT group
// of n sockets instead, registers the first, and answers "NAME local-addr
// i" on socket i.
func helperProxy() int {
	name := os.Getenv("RLTP_NAME")
	r, err := Attach(Config{PinRoot: os.Getenv("RLTP_PIN_ROOT"), Ports: []uint16{80}})
	if err != nil {
		fmt.Fprintln(os.Stderr, "helper attach:", err)
		return 2
	}
	defer r.Close()
	n, _ := strconv.Atoi(os.Getenv("RLTP_GROUP"))
	grouped := n > 0
	lns, err := listenGroupHere("tcp4", "127.0.0.1:0", max(n, 1))
	if err != nil {
		fmt.Fprintln(os.Stderr, "helper listen:", err)
		return 2
	}
	answer := func(c net.Conn, i int) {
		if grouped {
			fmt.Fprintf(c, "%s %s %d\n", name, c.LocalAddr(), i)
		} else {
			fmt.Fprintf(c, "%s %s\n", name, c.LocalAddr())
		}
		c.Close()
	}
	for i, ln := range lns {
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				answer(c, i)
			}
		}()
	}
	if err := r.RegisterListener(lns[0]); err != nil {
		fmt.Fprintln(os.Stderr, "helper register:", err)
		return 2
	}
	fmt.Println("ready")
	sc := bufio.NewScanner(os.Stdin)
	for sc.Scan() {
		on, err := r.ListenerRegistered(lns[0])
		fmt.Printf("registered=%v err=%v\n", on, err)
	}
	// Drain: serve what is already queued on every socket, then exit.
	for i, ln := range lns {
		conns, err := AcceptQueued(ln)
		for _, c := range conns {
			answer(c, i)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "helper drain:", err)
			return 2
		}
	}
	return 0
}

type helper struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	out   *bufio.Reader
}

func startHelper(t *testing.T, ns *netnstest.NS, root, name string, env ...string) *helper {
	t.Helper()
	cmd := ns.Command(context.Background(), os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "RLTP_REDIRECT_HELPER=1", "RLTP_PIN_ROOT="+root, "RLTP_NAME="+name)
	cmd.Env = append(cmd.Env, env...)
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	h := &helper{cmd: cmd, stdin: stdin, out: bufio.NewReader(stdout)}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	if line, err := h.out.ReadString('\n'); err != nil || line != "ready\n" {
		t.Fatalf("helper %s: %q %v", name, line, err)
	}
	return h
}

func (h *helper) registered(t *testing.T) string {
	t.Helper()
	if _, err := io.WriteString(h.stdin, "registered?\n"); err != nil {
		t.Fatal(err)
	}
	line, err := h.out.ReadString('\n')
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(line)
}

// load makes sequential connections from the client namespace until stop
// closes (bounded by max), counting who answered and how connections failed.
// failedAfterKill counts failed connections that started after killed was set.
type loadResult struct {
	by               map[string]int
	refused, failed  int
	failedAfterKill  int
	firstFailure     error
	total, completed int
}

func runLoad(p *netnstest.Pair, target string, stop <-chan struct{}, max int, killed *atomic.Bool, progress *atomic.Int64) <-chan loadResult {
	done := make(chan loadResult, 1)
	go func() {
		res := loadResult{by: map[string]int{}}
		_ = p.Client.Do(func() error {
			for i := 0; i < max; i++ {
				select {
				case <-stop:
					return nil
				default:
				}
				res.total++
				// A connection that starts after the kill completed must
				// not fail; one started before may have met the dying
				// listener, whenever its failure is seen.
				startedAfterKill := killed.Load()
				d := net.Dialer{Timeout: 10 * time.Second}
				c, err := d.Dial("tcp4", target)
				if err != nil {
					if errors.Is(err, syscall.ECONNREFUSED) {
						res.refused++
					} else {
						res.failed++
						if startedAfterKill {
							res.failedAfterKill++
						}
					}
					if res.firstFailure == nil {
						res.firstFailure = err
					}
					continue
				}
				_ = c.SetDeadline(time.Now().Add(10 * time.Second))
				line, err := bufio.NewReader(c).ReadString('\n')
				c.Close()
				if err != nil {
					res.failed++
					if startedAfterKill {
						res.failedAfterKill++
					}
					if res.firstFailure == nil {
						res.firstFailure = err
					}
					continue
				}
				res.completed++
				res.by[strings.Fields(line)[0]]++
				if progress != nil {
					progress.Add(1)
				}
			}
			return nil
		})
		done <- res
	}()
	return done
}

// TestProcessKillRestartTakeover: a real proxy process holding the
// redirect is killed with SIGKILL under load (connections fall through to
// the service, none refused), a new one resumes steering from the pins, and
// a third takes over from the second while it still runs.
func TestProcessKillRestartTakeover(t *testing.T) {
	requireBPF(t)
	p := netnstest.NewPair(t)
	root := netnstest.BPFFS(t) + "/rl-tproxy"
	node4 := netip.AddrPortFrom(p.NodeIP4, 80).String()
	service := listenTCP(t, p.Node, "tcp", ":80")
	serve(t, service, "service")

	a := startHelper(t, p.Node, root, "A")
	if got := mustAsk(t, p.Client, node4, nil); got != "A "+node4 {
		t.Fatalf("steered to helper A: %q", got)
	}

	stop := make(chan struct{})
	var killed atomic.Bool
	results := runLoad(p, node4, stop, 200000, &killed, nil)
	// Make sure the load is flowing through A before killing it.
	if got := a.registered(t); got != "registered=true err=<nil>" {
		t.Fatalf("A: %s", got)
	}
	if err := a.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = a.cmd.Wait()
	// Wait returns once the kernel closed A's files: from here on its
	// listener is out of the sockmap and no connection may fail.
	killed.Store(true)
	// A is gone: its listener left the sockmap, the service answers.
	if got := mustAsk(t, p.Client, node4, nil); got != "service "+node4 {
		t.Fatalf("after kill -9: %q", got)
	}
	st := statusIn(t, p.Node, root)
	if !st.Pinned || st.Sockets[0].Present {
		t.Fatalf("after kill -9, status: %+v", st)
	}

	b := startHelper(t, p.Node, root, "B")
	if got := mustAsk(t, p.Client, node4, nil); got != "B "+node4 {
		t.Fatalf("restarted helper B: %q", got)
	}
	c := startHelper(t, p.Node, root, "C")
	if got := mustAsk(t, p.Client, node4, nil); got != "C "+node4 {
		t.Fatalf("takeover by C: %q", got)
	}
	if got := b.registered(t); got != "registered=false err=<nil>" {
		t.Fatalf("B after takeover: %s", got)
	}
	// The load covered the kill, the restart and the takeover.
	close(stop)
	res := <-results
	t.Logf("load: %d connections, %d answered %v, %d refused, %d failed, %d of them after the kill (first: %v)",
		res.total, res.completed, res.by, res.refused, res.failed, res.failedAfterKill, res.firstFailure)
	if res.refused != 0 {
		t.Errorf("%d connections refused during kill/restart/takeover", res.refused)
	}
	// Only connections assigned to A's listener while the kernel tore the
	// killed process down can fail (reset): the one in flight at the kill
	// and, sequentially, any that reached the listener before its last fd
	// closed. After that (killed), through the restart and the takeover,
	// none may fail.
	if res.failedAfterKill != 0 {
		t.Errorf("%d connections failed after A's files were closed, want 0", res.failedAfterKill)
	}

	// B drains and exits normally; C keeps steering.
	b.stdin.Close()
	if err := b.cmd.Wait(); err != nil {
		t.Fatalf("B exit: %v", err)
	}
	if got := mustAsk(t, p.Client, node4, nil); got != "C "+node4 {
		t.Fatalf("after B exited: %q", got)
	}
	_ = c
}
