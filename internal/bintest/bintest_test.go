package bintest

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/rl-tproxy/rl-tproxy/internal/testkit"
)

func TestWriteFile(t *testing.T) {
	for _, tc := range []struct {
		name string
		perm os.FileMode
		old  string // existing content replaced, "" for a new file
		body string
	}{
		{name: "new private", perm: 0o600, body: "secret: x\n"},
		{name: "new readable", perm: 0o644, body: "policy: y\n"},
		{name: "replaces", perm: 0o644, old: "old content that is longer\n", body: "new\n"},
		{name: "empty", perm: 0o600, body: ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			p := filepath.Join(dir, "f.yaml")
			if tc.old != "" {
				if err := os.WriteFile(p, []byte(tc.old), tc.perm); err != nil {
					t.Fatal(err)
				}
			}
			if got := WriteFile(t, p, tc.body, tc.perm); got != p {
				t.Fatalf("WriteFile returned %q, want %q", got, p)
			}
			b, err := os.ReadFile(p)
			if err != nil {
				t.Fatal(err)
			}
			if string(b) != tc.body {
				t.Fatalf("content %q, want %q", b, tc.body)
			}
			fi, err := os.Stat(p)
			if err != nil {
				t.Fatal(err)
			}
			if fi.Mode().Perm() != tc.perm {
				t.Fatalf("perm %v, want %v", fi.Mode().Perm(), tc.perm)
			}
			if _, err := os.Stat(p + ".tmp"); !os.IsNotExist(err) {
				t.Fatalf("temporary file left behind: %v", err)
			}
		})
	}
}

// fatalTB records Fatalf instead of stopping the goroutine.
type fatalTB struct {
	testing.TB
	msgs []string
}

func (f *fatalTB) Helper() {}

func (f *fatalTB) Fatalf(format string, args ...any) {
	f.msgs = append(f.msgs, fmt.Sprintf(format, args...))
}

func TestWriteFileFails(t *testing.T) {
	p := filepath.Join(t.TempDir(), "missing-dir", "f.yaml")
	tb := &fatalTB{TB: t}
	if got := WriteFile(tb, p, "x", 0o600); got != "" {
		t.Fatalf("WriteFile returned %q on failure", got)
	}
	if len(tb.msgs) != 1 || !strings.Contains(tb.msgs[0], p+".tmp") {
		t.Fatalf("Fatalf messages %q, want one naming %s.tmp", tb.msgs, p)
	}
}

func TestBuild(t *testing.T) {
	testkit.NeedTool(t, "go", "golang-go")
	dir := t.TempDir()
	p, err := Build(dir)
	if err != nil {
		t.Fatal(err)
	}
	if p != filepath.Join(dir, "rl-tproxy") {
		t.Fatalf("Build returned %q, want %q", p, filepath.Join(dir, "rl-tproxy"))
	}
	fi, err := os.Stat(p)
	if err != nil {
		t.Fatal(err)
	}
	if !fi.Mode().IsRegular() || fi.Mode().Perm()&0o111 == 0 {
		t.Fatalf("%s is not an executable file: %v", p, fi.Mode())
	}
}

func TestModuleRoot(t *testing.T) {
	root, err := ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "cmd", "rl-tproxy")); err != nil {
		t.Fatalf("module root %s has no cmd/rl-tproxy: %v", root, err)
	}
}
