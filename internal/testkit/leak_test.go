package testkit

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestGoroutinesLeftNamesTheLeak(t *testing.T) {
	opts := []goleak.Option{goleak.IgnoreCurrent()}
	release, done := make(chan struct{}), make(chan struct{})
	go blockedUntil(release, done)
	err := goroutinesLeft(opts, 50*time.Millisecond)
	if err == nil || !strings.Contains(err.Error(), "blockedUntil") {
		t.Fatalf("with a blocked goroutine: %v, want an error naming blockedUntil", err)
	}
	close(release)
	<-done
	if err := goroutinesLeft(opts, LeakBound); err != nil {
		t.Fatalf("after it returned: %v", err)
	}
}

func blockedUntil(release <-chan struct{}, done chan<- struct{}) {
	<-release
	close(done)
}

func TestFDsLeftNamesTheLeak(t *testing.T) {
	before, err := openFDs()
	if err != nil {
		Missing(t, "needs /proc/self/fd: %v", err)
	}
	path := filepath.Join(t.TempDir(), "leaked")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	extra := fdsLeft(before, 50*time.Millisecond)
	if len(extra) != 1 || !strings.HasSuffix(extra[0], path) {
		t.Fatalf("with %s open: %q, want it alone", path, extra)
	}
	f.Close()
	if extra := fdsLeft(before, LeakBound); len(extra) != 0 {
		t.Fatalf("after closing: %q", extra)
	}
}

func TestWaitWithin(t *testing.T) {
	n := 0
	WaitWithin(t, LeakBound, "the third poll", func() bool { n++; return n == 3 })
	if n != 3 {
		t.Fatalf("polled %d times, want 3", n)
	}
	r := &recordTB{TB: t}
	WaitWithin(r, 20*time.Millisecond, "never", func() bool { return false })
	if !strings.Contains(r.failed, "never") {
		t.Fatalf("failure %q does not name what it waited for", r.failed)
	}
}
