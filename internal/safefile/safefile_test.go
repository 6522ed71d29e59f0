package safefile

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/rl-tproxy/rl-tproxy/internal/testkit"
)

// bounded runs f and fails t if it has not returned within 10s: every
// case here must answer instead of blocking.
func bounded(t *testing.T, f func()) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		defer close(done)
		f()
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("blocked")
	}
}

func TestReadRefusesNonRegularWithoutBlocking(t *testing.T) {
	dir := t.TempDir()
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	toFifo := filepath.Join(dir, "link-to-fifo")
	if err := os.Symlink(fifo, toFifo); err != nil {
		t.Fatal(err)
	}
	dangling := filepath.Join(dir, "dangling")
	if err := os.Symlink(filepath.Join(dir, "nothing"), dangling); err != nil {
		t.Fatal(err)
	}
	cases := []struct{ path, want string }{
		{fifo, "is a named pipe (FIFO)"},
		{toFifo, "is a named pipe (FIFO)"},
		{dir, "is a directory"},
		{"/dev/zero", "is a character device"},
		{dangling, "no such file"},
	}
	for _, tc := range cases {
		bounded(t, func() {
			_, err := Read(tc.path, 1<<20)
			if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), filepath.Base(tc.path)) {
				t.Errorf("%s: err %v, want %q naming the path", tc.path, err, tc.want)
			}
			if tc.want != "no such file" && !errors.Is(err, ErrNotRegular) {
				t.Errorf("%s: %v does not wrap ErrNotRegular", tc.path, err)
			}
			if _, _, err := ReadSecret(tc.path, 1<<20); err == nil {
				t.Errorf("%s: ReadSecret accepted it", tc.path)
			}
		})
	}
}

func TestReadBoundsSize(t *testing.T) {
	path := filepath.Join(t.TempDir(), "f")
	if err := os.WriteFile(path, []byte("0123456789"), 0o600); err != nil {
		t.Fatal(err)
	}
	if b, err := Read(path, 10); err != nil || string(b) != "0123456789" {
		t.Fatalf("at the limit: %q %v", b, err)
	}
	if _, err := Read(path, 9); err == nil || !strings.Contains(err.Error(), "larger than 9 bytes") {
		t.Fatalf("over the limit: %v", err)
	}
	link := filepath.Join(t.TempDir(), "link")
	if err := os.Symlink(path, link); err != nil {
		t.Fatal(err)
	}
	if b, err := Read(link, 10); err != nil || len(b) != 10 {
		t.Fatalf("through a symlink (a ConfigMap's ..data): %q %v", b, err)
	}
}

func TestReadSecretModes(t *testing.T) {
	cases := []struct {
		mode       os.FileMode
		ok, warned bool
	}{
		{0o600, true, false},
		{0o400, true, false},
		{0o640, true, false},
		{0o644, true, true},
		{0o620, false, false},
		{0o602, false, false},
		{0o666, false, false},
	}
	dir := t.TempDir()
	for _, tc := range cases {
		path := filepath.Join(dir, tc.mode.String())
		if err := os.WriteFile(path, []byte("secret"), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(path, tc.mode); err != nil { // not subject to umask
			t.Fatal(err)
		}
		data, warn, err := ReadSecret(path, 100)
		if (err == nil) != tc.ok {
			t.Errorf("mode %04o: err %v, want ok=%v", tc.mode, err, tc.ok)
			continue
		}
		if err != nil {
			if !errors.Is(err, ErrUnsafe) || !strings.Contains(err.Error(), "writable") {
				t.Errorf("mode %04o: %v", tc.mode, err)
			}
			continue
		}
		if string(data) != "secret" || (warn != "") != tc.warned {
			t.Errorf("mode %04o: data %q warning %q, want warned=%v", tc.mode, data, warn, tc.warned)
		}
	}
}

// A secret owned by another non-root user is refused; one owned by root
// or by the process's own user is read.
func TestReadSecretOwner(t *testing.T) {
	testkit.NeedRoot(t, "chown a file to another user")
	path := filepath.Join(t.TempDir(), "cred")
	if err := os.WriteFile(path, []byte("secret"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, _, err := ReadSecret(path, 100); err != nil {
		t.Fatalf("root-owned: %v", err)
	}
	if err := os.Chown(path, 4242, 4242); err != nil {
		t.Fatal(err)
	}
	_, _, err := ReadSecret(path, 100)
	if !errors.Is(err, ErrUnsafe) || !strings.Contains(err.Error(), "owned by uid 4242") {
		t.Fatalf("foreign owner: %v", err)
	}
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := secretMode(path, st, 4242); err != nil {
		t.Fatalf("owned by the process's own uid: %v", err)
	}
}
