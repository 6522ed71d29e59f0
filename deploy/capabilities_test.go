package deploy

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"

	"github.com/rl-tproxy/rl-tproxy/bpf"
	"github.com/rl-tproxy/rl-tproxy/internal/testkit"
)

// The DaemonSet and the systemd unit grant exactly wantCaps. This test
// proves on the running kernel that a root process holding only those
// capabilities can do everything rl-tproxy's redirect does at start-up and
// takeover (load the committed sk_lookup object with all its maps, attach
// it to a network namespace with a link, pin program, link and maps in
// bpffs, put a listener into the sockmap, reopen the pins), and that
// dropping either capability makes it fail.

const capProbeEnv = "RL_TPROXY_DEPLOY_CAP_PROBE"

func TestMain(m *testing.M) {
	if dir := os.Getenv(capProbeEnv); dir != "" {
		if err := capProbe(dir); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(3)
		}
		fmt.Println("probe ok")
		os.Exit(0)
	}
	code := m.Run()
	if buildDir != "" {
		os.RemoveAll(buildDir)
	}
	os.Exit(code)
}

// capProbe runs in a child process with reduced capabilities, in its own
// network namespace, and does what pkg/redirect does.
func capProbe(bpffs string) error {
	var objs bpf.SkLookupObjects
	if err := bpf.LoadSkLookupObjects(&objs, nil); err != nil {
		return fmt.Errorf("step load (prog + maps): %w", err)
	}
	defer objs.Close()
	ns, err := os.Open("/proc/self/ns/net")
	if err != nil {
		return fmt.Errorf("step open netns: %w", err)
	}
	defer ns.Close()
	var st unix.Stat_t
	if err := unix.Fstat(int(ns.Fd()), &st); err != nil {
		return fmt.Errorf("step stat netns: %w", err)
	}
	lnk, err := link.AttachNetNs(int(ns.Fd()), objs.Steer)
	if err != nil {
		return fmt.Errorf("step attach netns link: %w", err)
	}
	defer lnk.Close()
	dir := filepath.Join(bpffs, "rl-tproxy", fmt.Sprint(st.Ino))
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("step mkdir pin dir: %w", err)
	}
	if err := lnk.Pin(filepath.Join(dir, "link")); err != nil {
		return fmt.Errorf("step pin link: %w", err)
	}
	if err := objs.Steer.Pin(filepath.Join(dir, "prog")); err != nil {
		return fmt.Errorf("step pin prog: %w", err)
	}
	if err := objs.Sockets.Pin(filepath.Join(dir, "sockets")); err != nil {
		return fmt.Errorf("step pin sockmap: %w", err)
	}
	if err := objs.SteerPorts.Update(uint16(80), uint8(1), ebpf.UpdateAny); err != nil {
		return fmt.Errorf("step update steer_ports: %w", err)
	}
	lc := net.ListenConfig{}
	lc.SetMultipathTCP(false)
	ln, err := lc.Listen(context.Background(), "tcp4", "0.0.0.0:0")
	if err != nil {
		return fmt.Errorf("step listen: %w", err)
	}
	defer ln.Close()
	raw, err := ln.(*net.TCPListener).SyscallConn()
	if err != nil {
		return fmt.Errorf("step listener fd: %w", err)
	}
	// The takeover: a later process reopens the pinned sockmap and writes
	// its own listener into it.
	pinned, err := ebpf.LoadPinnedMap(filepath.Join(dir, "sockets"), nil)
	if err != nil {
		return fmt.Errorf("step open pinned sockmap: %w", err)
	}
	defer pinned.Close()
	var uerr error
	if err := raw.Control(func(fd uintptr) {
		uerr = pinned.Update(uint32(0), uint64(fd), ebpf.UpdateAny)
	}); err != nil {
		return fmt.Errorf("step listener control: %w", err)
	}
	if uerr != nil {
		return fmt.Errorf("step sockmap update (takeover): %w", uerr)
	}
	prog, err := ebpf.LoadPinnedProgram(filepath.Join(dir, "prog"), nil)
	if err != nil {
		return fmt.Errorf("step open pinned prog: %w", err)
	}
	defer prog.Close()
	if _, err := prog.Info(); err != nil {
		return fmt.Errorf("step pinned prog info (tag): %w", err)
	}
	if _, err := link.LoadPinnedLink(filepath.Join(dir, "link"), nil); err != nil {
		return fmt.Errorf("step open pinned link: %w", err)
	}
	return nil
}

// runCapProbe runs the probe in a fresh network namespace as root with
// exactly caps (names as setpriv spells them) in every capability set.
func runCapProbe(t *testing.T, bpffs string, caps []string) (string, error) {
	t.Helper()
	bounding := "-all"
	for _, c := range caps {
		bounding += ",+" + strings.ToLower(c)
	}
	// Root gets its permitted and effective sets from the bounding set at
	// execve, like a container with "drop: [ALL], add: caps" or a unit with
	// CapabilityBoundingSet=caps; no_new_privs as allowPrivilegeEscalation
	// false and NoNewPrivileges=yes set it.
	cmd := exec.Command("unshare", "--net", "--",
		"setpriv", "--no-new-privs", "--bounding-set="+bounding, "--inh-caps=-all", "--",
		os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), capProbeEnv+"="+bpffs)
	var out bytes.Buffer
	cmd.Stdout = &out
	cmd.Stderr = &out
	err := cmd.Run()
	return strings.TrimSpace(out.String()), err
}

func TestCapabilitiesSufficientAndNecessary(t *testing.T) {
	testkit.NeedRoot(t, "creates a network namespace, mounts bpffs and drops capabilities")
	testkit.NeedTool(t, "unshare", "util-linux")
	testkit.NeedTool(t, "setpriv", "util-linux")
	// The host mounts bpffs (systemd does at boot); the proxy never does.
	// A private bpffs instance keeps this test away from the host's pins.
	bpffs := t.TempDir()
	if err := unix.Mount("bpf", bpffs, "bpf", 0, "mode=0700"); err != nil {
		testkit.Missing(t, "needs to mount bpffs (CAP_SYS_ADMIN in the test's mount namespace): %v", err)
	}
	t.Cleanup(func() { _ = unix.Unmount(bpffs, unix.MNT_DETACH) })

	out, err := runCapProbe(t, bpffs, wantCaps)
	if err != nil {
		t.Fatalf("with exactly %v the redirect start-up fails: %v\n%s", wantCaps, err, out)
	}
	if out != "probe ok" {
		t.Fatalf("probe output %q", out)
	}
	for _, drop := range wantCaps {
		var rest []string
		for _, c := range wantCaps {
			if c != drop {
				rest = append(rest, c)
			}
		}
		t.Run("without_"+drop, func(t *testing.T) {
			out, err := runCapProbe(t, bpffs, rest)
			var exit *exec.ExitError
			if !errors.As(err, &exit) {
				t.Fatalf("without CAP_%s the probe should fail, got err=%v output=%q", drop, err, out)
			}
			if ws, ok := exit.Sys().(syscall.WaitStatus); !ok || ws.ExitStatus() != 3 {
				t.Fatalf("without CAP_%s: probe did not run to a capability error: %v\n%s", drop, err, out)
			}
			t.Logf("without CAP_%s: %s", drop, out)
		})
	}
}
