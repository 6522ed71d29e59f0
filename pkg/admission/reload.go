package admission

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"time"

	"github.com/rl-tproxy/rl-tproxy/internal/safefile"
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
	// Settle is the quiet period after a file event before the watcher
	// reloads (0 = DefaultSettle); see Watch.
	Settle time.Duration
	// MaxWait bounds how long the watcher waits for a writer to close the
	// file (0 = DefaultMaxWait).
	MaxWait time.Duration
	// deferred, if set (tests), is called each time the watcher put off a
	// reload because a file was still being written or did not load yet.
	deferred func(reason string)

	mu       sync.Mutex
	sum      [sha256.Size]byte
	have     bool
	credFile string // credentials file of the policy in force
	// applied, once a watcher runs, is signalled after each successful
	// apply, so that the watcher follows a changed credentials path.
	applied chan struct{}
}

// Mark records p's content as the content in force (after the initial
// load), so that a reload of identical files reports "unchanged". It is
// the digest of the exact bytes Load read (not the files as they are on
// disk now: an edit made since must still be applied by the next reload;
// see Stale). A policy not built by Load or Parse falls back to the disk.
func (r *Reloader) Mark(p *Policy) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.credFile = p.RateLimitly.CredentialsFile
	if p.hasSum {
		r.sum, r.have = p.sum, true
		return
	}
	if s, err := r.digest(r.credFile); err == nil {
		r.sum, r.have = s, true
	}
}

// Stale reports whether the files on disk differ from the content in
// force (or cannot be read): a caller that armed the watcher after Mark
// calls it to catch an edit made in between, and reloads if true.
func (r *Reloader) Stale() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	s, err := r.digest(r.credFile)
	return err != nil || !r.have || s != r.sum
}

// digest hashes the policy file and a credentials file.
func (r *Reloader) digest(credFile string) ([sha256.Size]byte, error) {
	files := make([][]byte, 0, 2)
	for _, f := range []string{r.Path, credFile} {
		if f == "" {
			continue
		}
		b, err := safefile.Read(f, maxFileSize)
		if err != nil {
			return [sha256.Size]byte{}, err
		}
		files = append(files, b)
	}
	return fileDigest(files...), nil
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
	return r.reload(trigger, nil)
}

// reload is Reload with r.mu held. When unsettled is not nil, a load
// error is not reported: unsettled is called with it and reload returns
// it (the watcher retries until the file is stable).
func (r *Reloader) reload(trigger string, unsettled func(error)) error {
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
	if err != nil && unsettled != nil {
		unsettled(err)
		return err
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
	if err == nil && p.hasSum {
		// The digest of the bytes actually parsed: exact, whatever the
		// files did around the load.
		sum, stable = p.sum, true
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
	if r.applied != nil {
		select {
		case r.applied <- struct{}{}:
		default:
		}
	}
	log.Info("policy reloaded", "trigger", trigger, "file", r.Path, "summary", p.Summary())
	observe(ReloadSuccess, 0)
	return nil
}
