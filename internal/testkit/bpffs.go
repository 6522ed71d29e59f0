package testkit

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"testing"
)

// HoldBPFFS starts a holder process in a new private mount namespace with
// its own bpffs on /sys/fs/bpf (as a host mounts it at boot) and returns
// the namespace's path for `nsenter --mount=`. Every process a test runs
// in that namespace sees the same bpffs, so a restarted or second proxy
// finds the pins the first one left (`ip netns exec` would give each
// process its own sysfs and so its own bpffs). The holder, and with it the
// bpffs and its pins, goes away when the test ends.
//
// It needs root and unshare (util-linux); without them, or when bpffs
// cannot be mounted, t ends through Missing.
func HoldBPFFS(t testing.TB) string {
	t.Helper()
	NeedRoot(t, "mounts bpffs in a private mount namespace")
	unshare := NeedTool(t, "unshare", "util-linux")
	cmd := exec.Command(unshare, "--mount", "--propagation", "private", "--",
		"sh", "-c", "mount -t bpf -o mode=0700 bpf /sys/fs/bpf && echo ready && exec cat")
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatalf("start the bpffs mount namespace holder: %v", err)
	}
	t.Cleanup(func() {
		stdin.Close()
		_ = cmd.Wait()
	})
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil || line != "ready\n" {
		Missing(t, "needs a mountable bpffs in a private mount namespace: %q %v", line, err)
		return ""
	}
	return fmt.Sprintf("/proc/%d/ns/mnt", cmd.Process.Pid)
}
