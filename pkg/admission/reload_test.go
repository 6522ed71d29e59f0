package admission

import (
	"context"
	"encoding/binary"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/rl-tproxy/rl-tproxy/internal/testkit"
)

func reloadPolicy(rate string) string {
	return fmt.Sprintf(`ratelimitly:
  embedded: true
zones:
  z: {bucket: "all", rate: %s}
services:
  - name: web
    listen: 127.0.0.1:18080
    upstream: 127.0.0.1:18081
    locations:
      - name: all
        limit: [z]
`, rate)
}

type applied struct {
	mu    sync.Mutex
	rates []uint32
	ch    chan uint32
}

func newApplied() *applied { return &applied{ch: make(chan uint32, 16)} }

func (a *applied) apply(p *Policy) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	r := p.Zones[0].Rate
	a.rates = append(a.rates, r)
	a.ch <- r
	return nil
}

// wait returns the next applied rate, failing after a bounded wait.
func (a *applied) wait(t *testing.T) uint32 {
	t.Helper()
	select {
	case r := <-a.ch:
		return r
	case <-time.After(10 * time.Second):
		t.Fatal("no reload applied within 10s")
		return 0
	}
}

// waitFor waits (bounded) until rate want is applied. A reload that raced
// a change may first re-apply the content it read (harmless: the next
// event applies the new one), so other values in between are skipped.
func (a *applied) waitFor(t *testing.T, want uint32) {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		select {
		case r := <-a.ch:
			if r == want {
				return
			}
		case <-deadline:
			t.Fatalf("rate %d never applied within 10s", want)
		}
	}
}

func TestReloadSignalValidInvalidUnchanged(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "policy.yaml")
	if err := os.WriteFile(path, []byte(reloadPolicy("10/s")), 0o644); err != nil {
		t.Fatal(err)
	}
	p, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	a := newApplied()
	var logs testkit.SyncBuffer
	var results []string
	r := &Reloader{Path: path, Apply: a.apply, Logger: slog.New(slog.NewTextHandler(&logs, nil)),
		Observe: func(res, trig string, n int) { results = append(results, fmt.Sprintf("%s/%s/%d", res, trig, n)) }}
	r.Mark(p)
	if err := r.Reload(TriggerSignal); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(reloadPolicy("20/s")), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := r.Reload(TriggerSignal); err != nil {
		t.Fatal(err)
	}
	if got := a.wait(t); got != 20 {
		t.Fatalf("applied rate %d", got)
	}
	bad := strings.Replace(reloadPolicy("20/s"), "limit: [z]", "limit: [nope]\n        bogus_key: 1", 1)
	if err := os.WriteFile(path, []byte(bad), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := r.Reload(TriggerSignal); err == nil {
		t.Fatal("invalid policy accepted")
	}
	want := []string{"unchanged/signal/0", "success/signal/0"}
	if len(results) != 3 || results[0] != want[0] || results[1] != want[1] || !strings.HasPrefix(results[2], "error/signal/") || results[2] == "error/signal/1" {
		t.Fatalf("results %v (want unchanged, success, error with >1 errors)", results)
	}
	out := logs.String()
	if !strings.Contains(out, path+":11:") || !strings.Contains(out, path+":12:") {
		t.Fatalf("errors not logged with FILE:LINE:\n%s", out)
	}
	if len(a.rates) != 1 {
		t.Fatalf("apply called %d times", len(a.rates))
	}
}

func TestReloadApplyErrorKeepsOld(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "policy.yaml")
	if err := os.WriteFile(path, []byte(reloadPolicy("10/s")), 0o644); err != nil {
		t.Fatal(err)
	}
	var got string
	r := &Reloader{Path: path, Apply: func(*Policy) error { return fmt.Errorf("client rebuild failed") },
		Observe: func(res, _ string, _ int) { got = res }}
	if err := r.Reload(TriggerSignal); err == nil || got != ReloadError {
		t.Fatalf("err %v result %q", err, got)
	}
}

// The watcher sees an in-place rewrite, an editor-style rename and a
// Kubernetes ConfigMap update (the ..data symlink swapped atomically).
func TestWatchFileAndConfigMapSwap(t *testing.T) {
	dir := t.TempDir()
	// ConfigMap layout: policy.yaml -> ..data/policy.yaml, ..data -> ..v1
	v1 := filepath.Join(dir, "..v1")
	if err := os.Mkdir(v1, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(v1, "policy.yaml"), []byte(reloadPolicy("10/s")), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("..v1", filepath.Join(dir, "..data")); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "policy.yaml")
	if err := os.Symlink("..data/policy.yaml", path); err != nil {
		t.Fatal(err)
	}
	p, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	a := newApplied()
	r := &Reloader{Path: path, Apply: a.apply}
	r.Mark(p)
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan struct{})
	done := make(chan error, 1)
	go func() { done <- r.Watch(ctx, "", ready) }()
	<-ready

	// ConfigMap update: write ..v2, point ..data_tmp at it, rename over ..data.
	v2 := filepath.Join(dir, "..v2")
	if err := os.Mkdir(v2, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(v2, "policy.yaml"), []byte(reloadPolicy("30/s")), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("..v2", filepath.Join(dir, "..data_tmp")); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(filepath.Join(dir, "..data_tmp"), filepath.Join(dir, "..data")); err != nil {
		t.Fatal(err)
	}
	a.waitFor(t, 30)

	// Plain file: replace the symlink by a file (rename), then rewrite it.
	tmp := filepath.Join(dir, "policy.yaml.tmp")
	if err := os.WriteFile(tmp, []byte(reloadPolicy("40/s")), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
	a.waitFor(t, 40)
	if err := os.WriteFile(path, []byte(reloadPolicy("50/s")), 0o644); err != nil {
		t.Fatal(err)
	}
	a.waitFor(t, 50)
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// FuzzReloadEvents: the inotify event decoder never panics on any bytes.
func FuzzReloadEvents(f *testing.F) {
	ev := func(wd int32, mask uint32, name string) []byte {
		n := (len(name) + 1 + 3) &^ 3
		b := make([]byte, 16+n)
		binary.NativeEndian.PutUint32(b[0:], uint32(wd))
		binary.NativeEndian.PutUint32(b[4:], mask)
		binary.NativeEndian.PutUint32(b[12:], uint32(n))
		copy(b[16:], name)
		return b
	}
	f.Add(ev(1, unix.IN_CLOSE_WRITE, "policy.yaml"))
	f.Add(append(ev(1, unix.IN_CREATE, "..data_tmp"), ev(1, unix.IN_MOVED_TO, "..data")...))
	f.Add([]byte{1, 2, 3})
	names := map[int32]map[string]bool{1: {"policy.yaml": true}}
	f.Fuzz(func(t *testing.T, b []byte) {
		relevant(b, names)
	})
}

func TestRelevantEvents(t *testing.T) {
	ev := func(wd int32, mask uint32, name string) []byte {
		n := (len(name) + 1 + 3) &^ 3
		b := make([]byte, 16+n)
		binary.NativeEndian.PutUint32(b[0:], uint32(wd))
		binary.NativeEndian.PutUint32(b[4:], mask)
		binary.NativeEndian.PutUint32(b[12:], uint32(n))
		copy(b[16:], name)
		return b
	}
	names := map[int32]map[string]bool{1: {"policy.yaml": true}}
	for _, c := range []struct {
		b    []byte
		want bool
	}{
		{ev(1, unix.IN_CLOSE_WRITE, "policy.yaml"), true},
		{ev(1, unix.IN_CLOSE_WRITE, "other.yaml"), false},
		{ev(2, unix.IN_CLOSE_WRITE, "policy.yaml"), false},
		{ev(1, unix.IN_MOVED_TO, "..data"), true},
		{append(ev(1, unix.IN_CREATE, "x"), ev(1, unix.IN_MOVED_TO, "policy.yaml")...), true},
		{ev(1, unix.IN_Q_OVERFLOW, ""), true},
	} {
		if got := relevant(c.b, names); got != c.want {
			t.Errorf("%x: %v, want %v", c.b, got, c.want)
		}
	}
}

// A change that lands while a reload is loading the file is not mistaken
// for "unchanged" later: the reload retries until it read stable content.
func TestReloadRacingChange(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "policy.yaml")
	if err := os.WriteFile(path, []byte(reloadPolicy("10/s")), 0o644); err != nil {
		t.Fatal(err)
	}
	p, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	a := newApplied()
	raced := false
	r := &Reloader{Path: path, Apply: a.apply, Load: func(path string) (*Policy, error) {
		p, err := Load(path)
		if !raced {
			raced = true // the file changes right after it was read
			if werr := os.WriteFile(path, []byte(reloadPolicy("20/s")), 0o644); werr != nil {
				t.Fatal(werr)
			}
		}
		return p, err
	}}
	r.Mark(p)
	if err := r.Reload(TriggerFile); err != nil {
		t.Fatal(err)
	}
	if got := a.wait(t); got != 20 {
		t.Fatalf("applied %d, want 20 (the content after the race)", got)
	}
	var res string
	r.Observe = func(result, _ string, _ int) { res = result }
	if err := r.Reload(TriggerFile); err != nil || res != ReloadUnchanged {
		t.Fatalf("second reload: %v %q", err, res)
	}
}

// An edit made between the initial Load and Mark (the node starting) is
// not taken as in force: Mark records the bytes Load read, Stale sees the
// difference, and the next reload applies the edit.
func TestMarkRecordsLoadedBytesNotDisk(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "policy.yaml")
	if err := os.WriteFile(path, []byte(reloadPolicy("10/s")), 0o644); err != nil {
		t.Fatal(err)
	}
	p, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(reloadPolicy("20/s")), 0o644); err != nil {
		t.Fatal(err)
	}
	a := newApplied()
	var results []string
	r := &Reloader{Path: path, Apply: a.apply, Observe: func(res, _ string, _ int) { results = append(results, res) }}
	r.Mark(p)
	if !r.Stale() {
		t.Fatal("Stale: the file changed after Load but is reported as in force")
	}
	if err := r.Reload(TriggerSignal); err != nil {
		t.Fatal(err)
	}
	if len(results) != 1 || results[0] != ReloadSuccess {
		t.Fatalf("reload results %v, want [%s]", results, ReloadSuccess)
	}
	if got := a.wait(t); got != 20 {
		t.Fatalf("applied rate %d, want 20", got)
	}
	if r.Stale() {
		t.Fatal("Stale after applying the file on disk")
	}
	if err := r.Reload(TriggerSignal); err != nil || results[len(results)-1] != ReloadUnchanged {
		t.Fatalf("second reload: %v, results %v; want unchanged", err, results)
	}
}
