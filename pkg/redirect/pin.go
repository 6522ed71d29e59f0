package redirect

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"

	"golang.org/x/sys/unix"
)

// DefaultPinRoot is where the pinned state lives unless Config.PinRoot says otherwise.
const DefaultPinRoot = "/sys/fs/bpf/rl-tproxy"

// Names of the pins inside PinRoot/<netns inode>/. Maps are pinned as
// "map_" + the map's name in the object.
const (
	pinLink    = "link"
	pinProgram = "prog"
	pinMapPfx  = "map_"
)

// netnsInode returns the inode of the calling thread's network namespace.
func netnsInode() (uint64, error) {
	var st unix.Stat_t
	if err := unix.Stat("/proc/thread-self/ns/net", &st); err != nil {
		return 0, fmt.Errorf("stat network namespace: %w", err)
	}
	return st.Ino, nil
}

// stateDir returns PinRoot/<netns inode> for the calling thread's namespace.
func stateDir(root string) (string, uint64, error) {
	if root == "" {
		root = DefaultPinRoot
	}
	ino, err := netnsInode()
	if err != nil {
		return "", 0, err
	}
	return filepath.Join(root, strconv.FormatUint(ino, 10)), ino, nil
}

// isBPFFS reports whether path is on a bpf filesystem.
func isBPFFS(path string) (bool, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		return false, err
	}
	return uint32(st.Type) == uint32(unix.BPF_FS_MAGIC), nil
}

// checkBPFFS verifies that path, or its nearest existing ancestor, is on a
// bpf filesystem, so pins never land on tmpfs or sysfs by mistake.
func checkBPFFS(path string) error {
	p := filepath.Clean(path)
	for {
		ok, err := isBPFFS(p)
		if err == nil {
			if !ok {
				return fmt.Errorf("%w: %s is not on a bpf filesystem (mount one: mount -t bpf bpf %s)", ErrNoBPFFS, p, p)
			}
			return nil
		}
		if !errors.Is(err, unix.ENOENT) {
			return fmt.Errorf("statfs %s: %w", p, err)
		}
		parent := filepath.Dir(p)
		if parent == p {
			return fmt.Errorf("%w: no existing ancestor of %s", ErrNoBPFFS, path)
		}
		p = parent
	}
}

// EnsureBPFFS mounts a bpf filesystem on dir (created if missing) unless dir
// already is one. `rl-tproxy run` calls it for /sys/fs/bpf, which many
// systems do not mount by default.
func EnsureBPFFS(dir string) error {
	if ok, err := isBPFFS(dir); err == nil && ok {
		return nil
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("create bpffs mount point %s: %w", dir, err)
	}
	if err := unix.Mount("bpf", dir, "bpf", 0, "mode=0700"); err != nil {
		return fmt.Errorf("mount bpffs on %s: %w", dir, err)
	}
	return nil
}

// lockDir takes an exclusive flock on dir (bpffs holds no regular files, so
// the directory itself is the lock). The returned func releases it.
func lockDir(dir string) (func(), error) {
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open %s for locking: %w", dir, err)
	}
	for {
		err = unix.Flock(fd, unix.LOCK_EX)
		if !errors.Is(err, unix.EINTR) {
			break
		}
	}
	if err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("flock %s: %w", dir, err)
	}
	return func() {
		_ = unix.Flock(fd, unix.LOCK_UN)
		unix.Close(fd)
	}, nil
}

// exists reports whether path exists (a pin, a directory).
func exists(path string) bool {
	_, err := os.Lstat(path)
	return err == nil
}

// removePins removes every pin in dir (not dir itself).
func removePins(dir string) error {
	ents, err := os.ReadDir(dir)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil
		}
		return fmt.Errorf("read %s: %w", dir, err)
	}
	var errs []error
	for _, e := range ents {
		if err := os.Remove(filepath.Join(dir, e.Name())); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// replacePin pins obj at path, replacing whatever is pinned there: it pins
// under a temporary name and renames over the old pin, so there is always a
// pin at path.
func replacePin(path string, pin func(string) error) error {
	tmp := path + "_new" // bpffs refuses names with dots
	_ = os.Remove(tmp)
	if err := pin(tmp); err != nil {
		return fmt.Errorf("pin %s: %w", tmp, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("rename pin %s: %w", path, err)
	}
	return nil
}
