package admission

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// Defaults of the watcher's settling (Reloader.Settle, Reloader.MaxWait).
const (
	DefaultSettle  = 250 * time.Millisecond
	DefaultMaxWait = 10 * time.Second
	// errorSettles is how many quiet periods a file that does not load
	// must stay byte-for-byte the same before the error is reported.
	errorSettles = 4
)

// watchMask is every event that can mean the content at a watched name
// changed, or that a write to it began or ended.
const watchMask = unix.IN_CLOSE_WRITE | unix.IN_MODIFY | unix.IN_MOVED_TO | unix.IN_MOVED_FROM |
	unix.IN_CREATE | unix.IN_DELETE | unix.IN_ATTRIB

// Watch reloads on changes of the policy file or its credentials file
// until ctx ends. It watches the files' directories (inotify), so an
// editor's rename, install(1), a rewrite, or a Kubernetes ConfigMap update
// (a swap of the `..data` symlink) are all seen. After a reload that
// changed the credentials path, it watches the new file instead (and
// reloads if that differs from what was applied). ready, if not nil, is
// closed once the watches are in place.
//
// Reloads settle: events are coalesced until none arrived for Settle; a
// watched file that was created or modified is not read until its writer
// closed it (IN_CLOSE_WRITE; at most MaxWait); and a file that does not
// load is retried every Settle and reported as an error only once it
// stayed the same for several quiet periods (or for MaxWait). So a
// partly written file is never applied, and a valid file installed by
// unlink-and-create or rename never counts as an error.
func (r *Reloader) Watch(ctx context.Context, credentialsFile string, ready chan<- struct{}) error {
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC | unix.IN_NONBLOCK)
	if err != nil {
		return fmt.Errorf("watch %s: inotify: %w", r.Path, err)
	}
	f := os.NewFile(uintptr(fd), "inotify")
	defer f.Close()
	w := &watchState{r: r, fd: fd, names: map[int32]map[string]bool{}, dirs: map[int32]string{}, dirty: map[string]time.Time{},
		warned: map[string]bool{}}
	if _, err := w.add(r.Path); err != nil {
		return err
	}
	if err := w.follow(credentialsFile); err != nil {
		return err
	}
	r.mu.Lock()
	if r.applied == nil {
		r.applied = make(chan struct{}, 1)
	}
	applied := r.applied
	r.mu.Unlock()
	if ready != nil {
		close(ready)
	}
	events, errc := readEvents(ctx, f)
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case err := <-errc:
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("watch %s: read inotify: %w", r.Path, err)
		case b := <-events:
			if w.note(b, time.Now()) {
				timer.Reset(r.settle())
			}
		case <-timer.C:
			if w.fire(time.Now()) {
				timer.Reset(r.settle())
			}
		case <-applied:
			// A reload may have changed the credentials path: watch the
			// new file, and reload if it changed before it was watched.
			r.mu.Lock()
			cred := r.credFile
			r.mu.Unlock()
			if cred == w.credFile {
				continue
			}
			if err := w.follow(cred); err != nil {
				r.logger().Warn("policy watch: cannot watch the new credentials file; SIGHUP reloads it", "error", err.Error())
				continue
			}
			if r.Stale() {
				w.pending = true
				timer.Reset(r.settle())
			}
		}
	}
}

// readEvents reads batches of inotify events from f until ctx ends or a
// read fails.
func readEvents(ctx context.Context, f *os.File) (<-chan []byte, <-chan error) {
	events, errc := make(chan []byte), make(chan error, 1)
	go func() {
		<-ctx.Done()
		f.Close() // unblocks Read
	}()
	go func() {
		buf := make([]byte, 64*(unix.SizeofInotifyEvent+unix.NAME_MAX+1))
		for {
			n, err := f.Read(buf)
			if err != nil {
				errc <- err
				return
			}
			select {
			case events <- bytes.Clone(buf[:n]):
			case <-ctx.Done():
				return
			}
		}
	}()
	return events, errc
}

func (r *Reloader) settle() time.Duration {
	if r.Settle > 0 {
		return r.Settle
	}
	return DefaultSettle
}

func (r *Reloader) maxWait() time.Duration {
	if r.MaxWait > 0 {
		return r.MaxWait
	}
	return DefaultMaxWait
}

// add watches file's directory for file's name and returns the watch.
func (w *watchState) add(file string) (int32, error) {
	dir := filepath.Dir(file)
	wd, err := unix.InotifyAddWatch(w.fd, dir, watchMask)
	if err != nil {
		return 0, fmt.Errorf("watch %s: inotify on %s: %w", file, dir, err)
	}
	if w.names[int32(wd)] == nil {
		w.names[int32(wd)] = map[string]bool{}
	}
	w.names[int32(wd)][filepath.Base(file)] = true
	w.dirs[int32(wd)] = dir
	return int32(wd), nil
}

// follow makes cred the watched credentials file ("" = none): it watches
// the new one, then stops watching the old one (and its directory when
// nothing else there is watched).
func (w *watchState) follow(cred string) error {
	wd := int32(-1)
	if cred != "" {
		var err error
		if wd, err = w.add(cred); err != nil {
			return err
		}
	}
	old, oldWD := w.credFile, w.credWD
	w.credFile, w.credWD = cred, wd
	if old == "" || old == cred || filepath.Clean(old) == filepath.Clean(w.r.Path) {
		return nil
	}
	if oldWD == wd && filepath.Base(old) == filepath.Base(cred) {
		return nil
	}
	delete(w.names[oldWD], filepath.Base(old))
	if oldWD == w.credWD || len(w.names[oldWD]) > 0 {
		return nil
	}
	delete(w.names, oldWD)
	delete(w.dirs, oldWD)
	_, _ = unix.InotifyRmWatch(w.fd, uint32(oldWD)) // gone with its directory is fine
	return nil
}

// watchState is the watcher's view between events and reloads.
type watchState struct {
	r        *Reloader
	fd       int
	credFile string                    // the watched credentials file ("" = none)
	credWD   int32                     // its directory's watch
	names    map[int32]map[string]bool // watch descriptor -> base names of interest
	dirs     map[int32]string          // watch descriptor -> directory
	// dirty holds the watched files a writer has open (created or
	// modified, not yet closed), with when that was first seen.
	dirty   map[string]time.Time
	warned  map[string]bool // dirty files already warned about
	pending bool
	// The last failed attempt: the files' state then, how many attempts
	// in a row saw that same state, and since when.
	failState string
	failCount int
	failSince time.Time
}

// note records a batch of events and reports whether any was relevant.
func (w *watchState) note(b []byte, now time.Time) bool {
	hit := false
	decodeEvents(b, func(wd int32, mask uint32, name string) {
		if mask&unix.IN_Q_OVERFLOW != 0 || strings.HasPrefix(name, "..") {
			hit = true // lost events, or a ConfigMap's atomic-writer entries
			return
		}
		if !w.names[wd][name] {
			return
		}
		hit = true
		key := filepath.Join(w.dirs[wd], name)
		switch {
		case mask&(unix.IN_CLOSE_WRITE|unix.IN_DELETE|unix.IN_MOVED_FROM|unix.IN_MOVED_TO) != 0:
			delete(w.dirty, key) // written and closed, gone, or a whole file renamed in
		case mask&unix.IN_MODIFY != 0:
			w.markDirty(key, now)
		case mask&unix.IN_CREATE != 0:
			// A regular file created in place is being written; a
			// symlink or directory is complete when it appears.
			if fi, err := os.Lstat(key); err == nil && fi.Mode().IsRegular() {
				w.markDirty(key, now)
			}
		}
	})
	if hit {
		w.pending = true
	}
	return hit
}

func (w *watchState) markDirty(key string, now time.Time) {
	if _, ok := w.dirty[key]; !ok {
		w.dirty[key] = now
		delete(w.warned, key)
	}
}

// openForWriting asks the kernel whether any process has path open for
// writing: a read lease (F_SETLEASE F_RDLCK) is refused with EAGAIN
// exactly then, and is released at once otherwise. It needs the file's
// owner or CAP_LEASE and a filesystem with leases; any other error means
// "cannot tell".
func openForWriting(path string) (bool, error) {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_NONBLOCK|unix.O_CLOEXEC|unix.O_NOCTTY, 0)
	if err != nil {
		return false, err
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFREG {
		return false, fmt.Errorf("%s: not a regular file", path)
	}
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_SETLEASE, unix.F_RDLCK); err != nil {
		if errors.Is(err, unix.EAGAIN) {
			return true, nil
		}
		return false, err
	}
	_, err = unix.FcntlInt(uintptr(fd), unix.F_SETLEASE, unix.F_UNLCK)
	return false, err
}

// fire runs when no event arrived for a quiet period. It reloads unless a
// file is still being written, and reports whether to try again later.
func (w *watchState) fire(now time.Time) (again bool) {
	r := w.r
	if !w.pending {
		return false
	}
	for key, since := range w.dirty {
		switch writing, err := openForWriting(key); {
		case err == nil && !writing:
			delete(w.dirty, key) // written without a close event (truncate(2), a hard link)
			continue
		case err == nil && writing:
			// The kernel says a writer has it open: never read it now.
			if now.Sub(since) >= r.maxWait() && !w.warned[key] {
				r.logger().Warn("policy watch: a file is still open for writing; waiting for its writer (SIGHUP reloads now)", "file", key)
				w.warned[key] = true
			}
			w.defer_("writing " + key)
			return true
		case now.Sub(since) < r.maxWait():
			// No lease here (not root, or a filesystem without leases):
			// wait for the close event, bounded.
			w.defer_("writing " + key)
			return true
		}
		r.logger().Warn("policy watch: no close event for a modified file; reloading anyway", "file", key, "waited", r.maxWait().String())
		delete(w.dirty, key)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	state := r.state()
	final := state == w.failState && (w.failCount+1 >= errorSettles || now.Sub(w.failSince) >= r.maxWait())
	var failed error
	var unsettled func(error)
	if !final {
		unsettled = func(err error) { failed = err }
	}
	_ = r.reload(TriggerFile, unsettled) // errors are logged and counted
	if failed != nil {
		if state == w.failState {
			w.failCount++
		} else {
			w.failState, w.failCount, w.failSince = state, 1, now
		}
		w.defer_("does not load yet: " + failed.Error())
		return true
	}
	w.pending, w.failState, w.failCount = false, "", 0
	return false
}

func (w *watchState) defer_(reason string) {
	w.r.logger().Debug("policy reload deferred", "reason", reason)
	if w.r.deferred != nil {
		w.r.deferred(reason)
	}
}

// state identifies the current content of the watched files (or why it
// cannot be read), to tell a file that settled broken from one still
// changing. r.mu is held.
func (r *Reloader) state() string {
	sum, err := r.digest(r.credFile)
	if err != nil {
		return "error: " + err.Error()
	}
	return hex.EncodeToString(sum[:])
}

// decodeEvents calls fn for each complete inotify event in b.
func decodeEvents(b []byte, fn func(wd int32, mask uint32, name string)) {
	for len(b) >= unix.SizeofInotifyEvent {
		wd := int32(binary.NativeEndian.Uint32(b[0:4]))
		mask := binary.NativeEndian.Uint32(b[4:8])
		l := int(binary.NativeEndian.Uint32(b[12:16]))
		if l < 0 || unix.SizeofInotifyEvent+l > len(b) {
			return
		}
		fn(wd, mask, string(bytes.TrimRight(b[unix.SizeofInotifyEvent:unix.SizeofInotifyEvent+l], "\x00")))
		b = b[unix.SizeofInotifyEvent+l:]
	}
}

// relevant reports whether a batch of inotify events touches a watched
// file name or a Kubernetes "..data"-style atomic-writer entry.
func relevant(b []byte, names map[int32]map[string]bool) bool {
	hit := false
	decodeEvents(b, func(wd int32, mask uint32, name string) {
		if mask&unix.IN_Q_OVERFLOW != 0 || names[wd][name] || strings.HasPrefix(name, "..") {
			hit = true
		}
	})
	return hit
}
