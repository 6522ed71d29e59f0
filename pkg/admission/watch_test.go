package admission

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rl-tproxy/rl-tproxy/internal/testkit"
)

// settlePolicy is a policy with zone rate rate and n locations.
func settlePolicy(rate string, n int) string {
	var b strings.Builder
	fmt.Fprintf(&b, "ratelimitly:\n  embedded: true\nzones:\n  z: {bucket: \"all\", rate: %s}\nservices:\n  - name: web\n    listen: 127.0.0.1:18080\n    upstream: 127.0.0.1:18081\n    locations:\n", rate)
	for i := range n {
		fmt.Fprintf(&b, "      - name: l%d\n        match: {path_prefix: /p%d/}\n        limit: [z]\n", i, i)
	}
	return b.String()
}

// settleRig is a watching Reloader that records every application
// ("rate/locations"), every observed result and every deferral.
type settleRig struct {
	t       *testing.T
	dir     string
	path    string
	r       *Reloader
	mu      sync.Mutex
	applied []string
	results []string
	ch      chan string
	defers  chan string
	// hold, when set, keeps the watcher inside its deferral callback
	// until it is closed.
	hold atomic.Pointer[chan struct{}]
}

func newSettleRig(t *testing.T) *settleRig {
	dir := t.TempDir()
	g := &settleRig{t: t, dir: dir, path: filepath.Join(dir, "policy.yaml"), ch: make(chan string, 64), defers: make(chan string, 4096)}
	if err := os.WriteFile(g.path, []byte(settlePolicy("10/s", 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	p, err := Load(g.path)
	if err != nil {
		t.Fatal(err)
	}
	g.r = &Reloader{Path: g.path, Settle: 50 * time.Millisecond, MaxWait: time.Minute,
		Apply: func(p *Policy) error {
			s := fmt.Sprintf("%d/%d", p.Zones[0].Rate, len(p.Services[0].Locations))
			g.mu.Lock()
			g.applied = append(g.applied, s)
			g.mu.Unlock()
			g.ch <- s
			return nil
		},
		Observe: func(res, trig string, n int) {
			g.mu.Lock()
			defer g.mu.Unlock()
			g.results = append(g.results, fmt.Sprintf("%s/%s/%d", res, trig, n))
		},
		deferred: func(reason string) {
			select {
			case g.defers <- reason:
			default:
			}
			if h := g.hold.Load(); h != nil {
				<-*h
			}
		},
	}
	g.r.Mark(p)
	ctx, cancel := context.WithCancel(context.Background())
	ready, done := make(chan struct{}), make(chan error, 1)
	go func() { done <- g.r.Watch(ctx, "", ready) }()
	<-ready
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
	return g
}

// waitApplied waits (bounded) for the next application and checks it.
func (g *settleRig) waitApplied(want string) {
	g.t.Helper()
	select {
	case got := <-g.ch:
		if got != want {
			g.t.Fatalf("applied %s, want %s (all: %v)", got, want, g.snapshot())
		}
	case <-time.After(20 * time.Second):
		g.t.Fatalf("%s never applied (all: %v, results %v)", want, g.snapshot(), g.resultsSnapshot())
	}
}

// waitDeferred waits (bounded) until the watcher put off a reload n times
// for a reason containing what, counting from now.
func (g *settleRig) waitDeferred(what string, n int) {
	g.t.Helper()
	for len(g.defers) > 0 {
		<-g.defers
	}
	deadline := time.After(20 * time.Second)
	for seen := 0; seen < n; {
		select {
		case r := <-g.defers:
			if strings.Contains(r, what) {
				seen++
			}
		case <-deadline:
			g.t.Fatalf("the watcher did not defer (%q) %d times", what, n)
		}
	}
}

func (g *settleRig) snapshot() []string {
	g.mu.Lock()
	defer g.mu.Unlock()
	return slices.Clone(g.applied)
}

func (g *settleRig) resultsSnapshot() []string {
	g.mu.Lock()
	defer g.mu.Unlock()
	return slices.Clone(g.results)
}

func (g *settleRig) write(path, body string) {
	g.t.Helper()
	if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
		g.t.Fatal(err)
	}
}

func (g *settleRig) run(name string, args ...string) {
	g.t.Helper()
	if out, err := exec.Command(name, args...).CombinedOutput(); err != nil {
		g.t.Fatalf("%s %v: %v: %s", name, args, err, out)
	}
}

// The ways operators and Kubernetes replace a policy file: each settled
// change is applied exactly once, a partly written file never, and a
// valid file never counts as an error.
func TestWatchSettlesInstallMvEditorConfigMap(t *testing.T) {
	install := testkit.NeedTool(t, "install", "coreutils")
	mv := testkit.NeedTool(t, "mv", "coreutils")
	g := newSettleRig(t)
	src := filepath.Join(t.TempDir(), "v.yaml")

	// install(1): unlink, create, write, chmod, close, in place.
	g.write(src, settlePolicy("20/s", 1))
	g.run(install, "-m", "0644", src, g.path)
	g.waitApplied("20/1")

	// mv over the file: a complete file renamed in.
	g.write(g.path+".new", settlePolicy("30/s", 1))
	g.run(mv, g.path+".new", g.path)
	g.waitApplied("30/1")

	// Editor style: truncate, write a prefix that is a valid policy by
	// itself, pause while the watcher looks at it, write the rest.
	full := settlePolicy("40/s", 2)
	prefix := settlePolicy("40/s", 1)
	if !strings.HasPrefix(full, prefix) {
		t.Fatal("test policy: the prefix is not a prefix")
	}
	f, err := os.OpenFile(g.path, os.O_WRONLY|os.O_TRUNC, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteString(prefix); err != nil {
		t.Fatal(err)
	}
	g.waitDeferred("writing", 3) // three quiet periods with the prefix on disk
	if _, err := f.WriteString(full[len(prefix):]); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	g.waitApplied("40/2")

	// ConfigMap: the file becomes policy.yaml -> ..data/policy.yaml,
	// ..data -> ..v1; then an update swaps ..data to ..v2 and removes ..v1.
	for _, v := range []struct{ dir, body string }{{"..v1", settlePolicy("50/s", 1)}, {"..v2", settlePolicy("60/s", 1)}} {
		if err := os.Mkdir(filepath.Join(g.dir, v.dir), 0o755); err != nil {
			t.Fatal(err)
		}
		g.write(filepath.Join(g.dir, v.dir, "policy.yaml"), v.body)
	}
	if err := os.Symlink("..v1", filepath.Join(g.dir, "..data")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("..data/policy.yaml", g.path+".lnk"); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(g.path+".lnk", g.path); err != nil {
		t.Fatal(err)
	}
	g.waitApplied("50/1")
	if err := os.Symlink("..v2", filepath.Join(g.dir, "..data_tmp")); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(filepath.Join(g.dir, "..data_tmp"), filepath.Join(g.dir, "..data")); err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(filepath.Join(g.dir, "..v1")); err != nil {
		t.Fatal(err)
	}
	g.waitApplied("60/1")

	// A last change through mv: anything still pending from the earlier
	// ones would show up before it.
	g.write(g.path+".new", settlePolicy("70/s", 1))
	if err := os.Remove(g.path); err != nil { // the symlink, not ..v2
		t.Fatal(err)
	}
	g.run(mv, g.path+".new", g.path)
	g.waitApplied("70/1")

	if got, want := g.snapshot(), []string{"20/1", "30/1", "40/2", "50/1", "60/1", "70/1"}; !slices.Equal(got, want) {
		t.Fatalf("applied %v, want exactly %v (one generation per settled change, never the prefix)", got, want)
	}
	// The result is observed just after Apply returns: wait for the sixth.
	count := func(prefix string) int {
		n := 0
		for _, r := range g.resultsSnapshot() {
			if strings.HasPrefix(r, prefix) {
				n++
			}
		}
		return n
	}
	for deadline := time.Now().Add(10 * time.Second); count(ReloadSuccess) < 6 && time.Now().Before(deadline); {
		time.Sleep(5 * time.Millisecond)
	}
	if count(ReloadSuccess) != 6 || count(ReloadError) != 0 {
		t.Errorf("results %v, want 6 successes and no error", g.resultsSnapshot())
	}
}

// A file missing for a while is retried, not reported, when it comes back
// valid; a file that settles broken is reported once, and never applied.
func TestWatchMissingThenBrokenFile(t *testing.T) {
	g := newSettleRig(t)
	hold := make(chan struct{})
	g.hold.Store(&hold)
	if err := os.Remove(g.path); err != nil {
		t.Fatal(err)
	}
	g.waitDeferred("does not load yet", 1) // the watcher is held in its first retry
	g.write(g.path, settlePolicy("80/s", 1))
	g.hold.Store(nil)
	close(hold)
	g.waitApplied("80/1")
	for _, r := range g.resultsSnapshot() {
		if strings.HasPrefix(r, ReloadError) {
			t.Fatalf("a file missing for a moment counted as an error: %v", g.resultsSnapshot())
		}
	}

	g.write(g.path+".new", "services: [\n")
	if err := os.Rename(g.path+".new", g.path); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for !slices.ContainsFunc(g.resultsSnapshot(), func(r string) bool { return strings.HasPrefix(r, ReloadError+"/file/") }) {
		if time.Now().After(deadline) {
			t.Fatalf("a broken file was never reported: %v", g.resultsSnapshot())
		}
		time.Sleep(10 * time.Millisecond)
	}
	// Fix it: the next valid file is applied and the error was counted once.
	g.write(g.path+".new", settlePolicy("90/s", 1))
	if err := os.Rename(g.path+".new", g.path); err != nil {
		t.Fatal(err)
	}
	g.waitApplied("90/1")
	errs := 0
	for _, r := range g.resultsSnapshot() {
		if strings.HasPrefix(r, ReloadError) {
			errs++
		}
	}
	if errs != 1 { // the error is observed before the next file's events
		t.Fatalf("%d errors counted for one broken file: %v", errs, g.resultsSnapshot())
	}
	if got := g.snapshot(); !slices.Equal(got, []string{"80/1", "90/1"}) {
		t.Fatalf("applied %v", got)
	}
}

func TestOpenForWriting(t *testing.T) {
	path := filepath.Join(t.TempDir(), "f")
	if err := os.WriteFile(path, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	if w, err := openForWriting(path); err != nil || w {
		t.Fatalf("no writer: %v %v", w, err)
	}
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if w, err := openForWriting(path); err != nil || !w {
		f.Close()
		t.Fatalf("with a writer: %v %v (leases unsupported here?)", w, err)
	}
	f.Close()
	if w, err := openForWriting(path); err != nil || w {
		t.Fatalf("after the writer closed: %v %v", w, err)
	}
	if _, err := openForWriting(t.TempDir()); err == nil {
		t.Fatal("a directory")
	}
}

// The case: unlink, create, write a valid prefix, pause far past
// MaxWait, write the rest. While the kernel reports the writer (a lease
// cannot be taken) the prefix is never applied, however long it waits.
func TestWatchUnlinkCreateSlowWriterPastMaxWait(t *testing.T) {
	g := newSettleRig(t)
	g.r.MaxWait = time.Millisecond // the fallback bound is long gone
	if err := os.Remove(g.path); err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(g.path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	full, prefix := settlePolicy("40/s", 2), settlePolicy("40/s", 1)
	if _, err := f.WriteString(prefix); err != nil {
		t.Fatal(err)
	}
	g.waitDeferred("writing", 5)
	if _, err := f.WriteString(full[len(prefix):]); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	g.waitApplied("40/2")
	if got := g.snapshot(); !slices.Equal(got, []string{"40/2"}) {
		t.Fatalf("applied %v", got)
	}
	for _, r := range g.resultsSnapshot() {
		if strings.HasPrefix(r, ReloadError) {
			t.Fatalf("results %v", g.resultsSnapshot())
		}
	}
}
