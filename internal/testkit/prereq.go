// Package testkit is the shared kit of the project's tests: prerequisite
// checks that skip locally but fail under RL_TPROXY_STRICT=1 (as CI runs),
// bounded waits on observable state (WaitFor), goroutine and descriptor
// leak checks for TestMain (VerifyMain), and a private bpffs for processes
// that share pins (HoldBPFFS). Subpackage rlcluster starts a RateLimitly
// cluster. test/README.md says which tests need what.
package testkit

import (
	"fmt"
	"os"
	"os/exec"
	"testing"
)

// StrictEnv is the environment variable that turns a missing prerequisite
// (root, a Debian tool, BPF, bpffs, IPv6, ...) from a skip into a failure.
// .ci/run sets it: CI cannot go green without the tests that need them.
const StrictEnv = "RL_TPROXY_STRICT"

// Strict reports whether missing prerequisites fail tests.
func Strict() bool {
	v := os.Getenv(StrictEnv)
	return v != "" && v != "0"
}

// Missing ends t because a prerequisite is missing: a skip with the reason,
// or under RL_TPROXY_STRICT a failure naming what is missing.
func Missing(t testing.TB, format string, args ...any) {
	t.Helper()
	msg := fmt.Sprintf(format, args...)
	if Strict() {
		t.Fatalf("missing prerequisite (%s=1 makes this a failure): %s", StrictEnv, msg)
	} else {
		t.Skip("missing prerequisite: " + msg)
	}
}

// NeedRoot ends t (Missing) unless the test runs as root.
func NeedRoot(t testing.TB, why string) {
	t.Helper()
	if os.Geteuid() != 0 {
		Missing(t, "needs root: %s", why)
	}
}

// NeedTool ends t (Missing) unless cmd is on PATH (or in /usr/sbin, /sbin)
// and returns its path. pkg is the Debian package that provides it.
func NeedTool(t testing.TB, cmd, pkg string) string {
	t.Helper()
	if p, err := exec.LookPath(cmd); err == nil {
		return p
	}
	for _, dir := range []string{"/usr/sbin/", "/sbin/"} {
		if _, err := os.Stat(dir + cmd); err == nil {
			return dir + cmd
		}
	}
	Missing(t, "needs %s (Debian package %s; make deps installs it)", cmd, pkg)
	return ""
}
