package steer

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"

	"github.com/rl-tproxy/rl-tproxy/internal/testkit"
	"github.com/rl-tproxy/rl-tproxy/pkg/redirect"
)

// foreignEnv makes the test binary swap another build's program into the
// pinned link of its network namespace (run inside the node's namespaces).
const foreignEnv = "RLTP_STEER_FOREIGN"

// installForeignProgram replaces the program of the pinned sk_lookup link
// of the calling process's network namespace with one that passes every
// connection: what a node looks like after an earlier build pinned its
// own program.
func installForeignProgram() error {
	var st unix.Stat_t
	if err := unix.Stat("/proc/self/ns/net", &st); err != nil {
		return err
	}
	pin := filepath.Join(redirect.DefaultPinRoot, strconv.FormatUint(st.Ino, 10), "link")
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{
		Type:         ebpf.SkLookup,
		AttachType:   ebpf.AttachSkLookup,
		License:      "Dual BSD/GPL",
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, 1), asm.Return()}, // SK_PASS, no socket
	})
	if err != nil {
		return fmt.Errorf("load foreign program: %w", err)
	}
	defer prog.Close()
	l, err := link.LoadPinnedLink(pin, nil)
	if err != nil {
		return fmt.Errorf("open pinned link %s: %w", pin, err)
	}
	defer l.Close()
	if err := l.Update(prog); err != nil {
		return fmt.Errorf("swap in the foreign program: %w", err)
	}
	return nil
}

// TestUpgradeRedirect: on a node whose pinned program is another build's,
// `run` refuses to start (exit 2, naming --upgrade-redirect) and the node
// keeps passing connections through that program; with
// --upgrade-redirect it replaces the program in place and takes over from
// the running proxy, which drains and exits; under a client load loop
// nothing is refused or reset.
func TestUpgradeRedirect(t *testing.T) {
	e := newEnv(t, false)
	first := e.startProxy("proxy-1")
	l := e.startLoad(t)
	l.waitMore(t, "proxied", &l.viaProxy, 20)

	l.setPhase("foreign program")
	args := append([]string{"--mount=" + e.mnt, "--net=" + e.pair.Node.Path(), "--", "env", foreignEnv + "=1"}, os.Args[0], "-test.run=^$")
	if out, err := runBounded(t, waitBound, "nsenter", args...); err != nil {
		t.Fatalf("install a foreign program: %v\n%s", err, out)
	}
	// It passes every connection to nginx.
	l.waitMore(t, "direct", &l.direct, 20)

	l.setPhase("refused start")
	refused := startProc(t, "proxy-refused", e.inNode("run", "--policy", e.policy, "--admin", "127.0.0.1:0",
		"--log-format", "json", "--watch=false"))
	if !refused.waitExit(waitBound) {
		t.Fatalf("run over another build's program did not exit\n%s", refused.tail(20))
	}
	var ee *exec.ExitError
	if err := refused.waitErr(); !errors.As(err, &ee) || ee.ExitCode() != 2 {
		t.Errorf("run over another build's program: %v, want exit 2", err)
	}
	if out := strings.Join(refused.snapshot(), "\n"); !strings.Contains(out, "--upgrade-redirect") {
		t.Errorf("the refusal does not name --upgrade-redirect:\n%s", refused.tail(20))
	}

	l.setPhase("upgrade")
	second := e.startProxy("proxy-2", "--upgrade-redirect")
	second.waitLine(t, "the upgrade warning", 0, msgIs("replaced the pinned sk_lookup program of another build in place"))
	testkit.WaitWithin(t, waitBound, "the upgraded proxy to serve the load", func() bool { return second.countPath("/open/load") >= 50 })
	if out, err := runBounded(t, waitBound, "nsenter", e.nodeArgs("redirect", "status")...); err != nil || !strings.Contains(string(out), "matches this binary: yes") {
		t.Errorf("redirect status after the upgrade: %v\n%s", err, out)
	}
	l.setPhase("old proxy exit")
	if !first.waitExit(30 * time.Second) {
		t.Fatalf("the proxy taken over by the upgrading one still runs\n%s", first.tail(20))
	}
	if err := first.waitErr(); err != nil {
		t.Errorf("taken-over proxy exited with %v, want 0", err)
	}
	l.setPhase("after")
	l.waitMore(t, "proxied", &l.viaProxy, 50)
	l.halt()
	t.Logf("load: %s", l)
	if l.refused.Load() != 0 || l.reset.Load() != 0 || l.other.Load() != 0 {
		t.Errorf("over the foreign program, the refused start and the upgrade: %s; want no refusal, reset or other failure", l)
	}
}
