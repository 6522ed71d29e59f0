package admission

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"golang.org/x/sys/unix"
)

// Reload triggers.
const (
	TriggerSignal = "signal"
	TriggerFile   = "file"
)

// Reload results.
const (
	ReloadSuccess   = "success"
	ReloadError     = "error"
	ReloadUnchanged = "unchanged"
)

// Reloader reloads a policy file on demand (SIGHUP) and on file change:
// the new file is loaded and validated fully, then handed to Apply, which
// swaps it in atomically. On any error the policy in force stays, every
// FILE:LINE error is logged, and the attempt is counted.
type Reloader struct {
	Path string
	// Load loads and validates a policy (nil = Load).
	Load func(path string) (*Policy, error)
	// Apply installs a validated policy; an error rejects it (the old one
	// stays in force).
	Apply func(p *Policy) error
	// Logger receives the reload results and errors (nil discards).
	Logger *slog.Logger
	// Observe is called once per attempt with the result (ReloadSuccess,
	// ReloadError, ReloadUnchanged), the trigger and the number of errors.
	Observe func(result, trigger string, errs int)

	mu       sync.Mutex
	sum      [sha256.Size]byte
	have     bool
	credFile string // credentials file of the policy in force
}

// Mark records p's files as the content in force (after the initial load),
// so that a reload of identical files reports "unchanged".
func (r *Reloader) Mark(p *Policy) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.credFile = p.RateLimitly.CredentialsFile
	if s, err := r.digest(r.credFile); err == nil {
		r.sum, r.have = s, true
	}
}

// digest hashes the policy file and a credentials file.
func (r *Reloader) digest(credFile string) ([sha256.Size]byte, error) {
	h := sha256.New()
	for _, f := range []string{r.Path, credFile} {
		if f == "" {
			continue
		}
		b, err := os.ReadFile(f)
		if err != nil {
			return [sha256.Size]byte{}, err
		}
		fmt.Fprintf(h, "%d:", len(b))
		h.Write(b)
	}
	var s [sha256.Size]byte
	copy(s[:], h.Sum(nil))
	return s, nil
}

func (r *Reloader) logger() *slog.Logger {
	if r.Logger == nil {
		return slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	return r.Logger
}

// Reload loads the file and applies it when it is valid and its content
// (policy or credentials) changed. It returns the load or apply error.
func (r *Reloader) Reload(trigger string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	log := r.logger()
	load := r.Load
	if load == nil {
		load = Load
	}
	observe := func(result string, errs int) {
		if r.Observe != nil {
			r.Observe(result, trigger, errs)
		}
	}
	// The files can change while they are loaded: hash them before and
	// after, and only remember content that was stable across the load, so
	// that a change racing this reload is never mistaken for "unchanged".
	var (
		p      *Policy
		err    error
		sum    [sha256.Size]byte
		stable bool
	)
	for attempt := 0; attempt < 3 && !stable; attempt++ {
		pre, preErr := r.digest(r.credFile)
		p, err = load(r.Path)
		if err != nil {
			break
		}
		var derr error
		sum, derr = r.digest(p.RateLimitly.CredentialsFile)
		stable = preErr == nil && derr == nil && pre == sum && r.credFile == p.RateLimitly.CredentialsFile
		if !stable && r.credFile != p.RateLimitly.CredentialsFile && preErr == nil && derr == nil {
			r.credFile = p.RateLimitly.CredentialsFile // hash the new credentials file next time
		}
	}
	if err != nil {
		n := 1
		var le *LoadError
		if errors.As(err, &le) && len(le.Errs) > 0 {
			n = len(le.Errs)
			for _, e := range le.Errs {
				log.Error("policy reload rejected", "trigger", trigger, "error", e.Error())
			}
		} else {
			log.Error("policy reload rejected", "trigger", trigger, "error", err.Error())
		}
		log.Warn("keeping the policy in force", "file", r.Path, "errors", n)
		observe(ReloadError, n)
		return err
	}
	if stable && r.have && sum == r.sum {
		log.Debug("policy unchanged", "trigger", trigger, "file", r.Path)
		observe(ReloadUnchanged, 0)
		return nil
	}
	if err := r.Apply(p); err != nil {
		log.Error("policy reload rejected", "trigger", trigger, "file", r.Path, "error", err.Error())
		log.Warn("keeping the policy in force", "file", r.Path, "errors", 1)
		observe(ReloadError, 1)
		return fmt.Errorf("apply policy %s: %w", r.Path, err)
	}
	r.credFile = p.RateLimitly.CredentialsFile
	r.sum, r.have = sum, stable
	log.Info("policy reloaded", "trigger", trigger, "file", r.Path, "summary", p.Summary())
	observe(ReloadSuccess, 0)
	return nil
}

// Watch reloads on changes of the policy file or its credentials file
// until ctx ends. It watches the files' directories (inotify), so an
// editor's rename, a rewrite, or a Kubernetes ConfigMap update (a swap of
// the `..data` symlink) are all seen. ready, if not nil, is closed once
// the watches are in place.
func (r *Reloader) Watch(ctx context.Context, credentialsFile string, ready chan<- struct{}) error {
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC | unix.IN_NONBLOCK)
	if err != nil {
		return fmt.Errorf("watch %s: inotify: %w", r.Path, err)
	}
	f := os.NewFile(uintptr(fd), "inotify")
	defer f.Close()
	const mask = unix.IN_CLOSE_WRITE | unix.IN_MOVED_TO | unix.IN_CREATE | unix.IN_DELETE | unix.IN_ATTRIB
	names := map[int32]map[string]bool{} // watch descriptor -> base names of interest
	for _, file := range []string{r.Path, credentialsFile} {
		if file == "" {
			continue
		}
		dir := filepath.Dir(file)
		wd, err := unix.InotifyAddWatch(fd, dir, mask)
		if err != nil {
			return fmt.Errorf("watch %s: inotify on %s: %w", file, dir, err)
		}
		if names[int32(wd)] == nil {
			names[int32(wd)] = map[string]bool{}
		}
		names[int32(wd)][filepath.Base(file)] = true
	}
	if ready != nil {
		close(ready)
	}
	go func() {
		<-ctx.Done()
		f.Close() // unblocks Read
	}()
	buf := make([]byte, 64*(unix.SizeofInotifyEvent+unix.NAME_MAX+1))
	for {
		n, err := f.Read(buf)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("watch %s: read inotify: %w", r.Path, err)
		}
		if relevant(buf[:n], names) {
			_ = r.Reload(TriggerFile) // errors are logged and counted
		}
	}
}

// relevant reports whether a batch of inotify events touches a watched
// file name or a Kubernetes "..data"-style atomic-writer entry.
func relevant(b []byte, names map[int32]map[string]bool) bool {
	hit := false
	for len(b) >= unix.SizeofInotifyEvent {
		wd := int32(binary.NativeEndian.Uint32(b[0:4]))
		mask := binary.NativeEndian.Uint32(b[4:8])
		l := int(binary.NativeEndian.Uint32(b[12:16]))
		if unix.SizeofInotifyEvent+l > len(b) {
			break
		}
		name := string(bytes.TrimRight(b[unix.SizeofInotifyEvent:unix.SizeofInotifyEvent+l], "\x00"))
		if mask&unix.IN_Q_OVERFLOW != 0 || names[wd][name] || strings.HasPrefix(name, "..") {
			hit = true
		}
		b = b[unix.SizeofInotifyEvent+l:]
	}
	return hit
}
