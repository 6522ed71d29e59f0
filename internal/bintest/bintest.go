// Package bintest builds the rl-tproxy binary once for a test binary and writes test files atomically.
package bintest

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// ModuleRoot returns the directory holding the go.mod of the module the
// current working directory belongs to, as reported by `go env GOMOD`.
func ModuleRoot() (string, error) {
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("go env GOMOD: %w", err)
	}
	gomod := strings.TrimSpace(string(out))
	if gomod == "" || gomod == os.DevNull {
		return "", errors.New("go env GOMOD: not inside a module")
	}
	return filepath.Dir(gomod), nil
}

// Build runs `go build -o dir/rl-tproxy ./cmd/rl-tproxy` from the module
// root, with the build's output on stderr, and returns the binary's path.
func Build(dir string) (string, error) {
	root, err := ModuleRoot()
	if err != nil {
		return "", err
	}
	path := filepath.Join(dir, "rl-tproxy")
	build := exec.Command("go", "build", "-o", path, "./cmd/rl-tproxy")
	build.Dir = root
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		return "", fmt.Errorf("go build ./cmd/rl-tproxy in %s: %w", root, err)
	}
	return path, nil
}

// WriteFile writes body to path with permissions perm through a temporary
// file renamed over path, so a process watching path never reads a partly
// written file. It returns path and fails t on error.
func WriteFile(t testing.TB, path, body string, perm os.FileMode) string {
	t.Helper()
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(body), perm); err != nil {
		t.Fatalf("write %s: %v", tmp, err)
		return ""
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatalf("rename %s to %s: %v", tmp, path, err)
		return ""
	}
	return path
}
