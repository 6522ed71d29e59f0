// Package safefile reads the files an operator points the proxy at
// (policy, credentials, anything they name) without ever blocking on
// them: only regular files, opened non-blocking, bounded in size, with
// ssh-style ownership and permission rules for files that hold secrets.
package safefile

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"syscall"

	"golang.org/x/sys/unix"
)

// ErrNotRegular is wrapped by every error about a path that is not a
// regular file (directory, FIFO, device, socket).
var ErrNotRegular = errors.New("not a regular file")

// ErrUnsafe is wrapped by every error about a secret file whose owner or
// permissions let someone else change it.
var ErrUnsafe = errors.New("unsafe ownership or permissions")

// kind names a non-regular file type for an error message.
func kind(m fs.FileMode) string {
	switch {
	case m.IsDir():
		return "a directory"
	case m&fs.ModeNamedPipe != 0:
		return "a named pipe (FIFO)"
	case m&fs.ModeCharDevice != 0:
		return "a character device"
	case m&fs.ModeDevice != 0:
		return "a block device"
	case m&fs.ModeSocket != 0:
		return "a socket"
	case m&fs.ModeSymlink != 0:
		return "a dangling symlink"
	}
	return "not a regular file"
}

func notRegular(path string, m fs.FileMode) error {
	return fmt.Errorf("%s is %s, %w", path, kind(m), ErrNotRegular)
}

// Open opens the regular file at path for reading. It looks before it
// opens (Lstat, and Stat through a symlink), so a FIFO or a device is
// never opened at all; the open itself is O_NONBLOCK, and the opened file
// is checked again, so a path swapped to a FIFO between the two checks
// cannot block either.
func Open(path string) (*os.File, fs.FileInfo, error) {
	fi, err := os.Lstat(path)
	if err != nil {
		return nil, nil, err
	}
	if fi.Mode()&fs.ModeSymlink != 0 {
		if fi, err = os.Stat(path); err != nil {
			return nil, nil, err
		}
	}
	if !fi.Mode().IsRegular() {
		return nil, nil, notRegular(path, fi.Mode())
	}
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_NONBLOCK|unix.O_CLOEXEC|unix.O_NOCTTY, 0)
	if err != nil {
		return nil, nil, &fs.PathError{Op: "open", Path: path, Err: err}
	}
	f := os.NewFile(uintptr(fd), path)
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, nil, err
	}
	if !st.Mode().IsRegular() {
		f.Close()
		return nil, nil, notRegular(path, st.Mode())
	}
	return f, st, nil
}

// Read returns the contents of the regular file at path; a file over max
// bytes is an error.
func Read(path string, max int64) ([]byte, error) {
	f, _, err := Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return readMax(f, path, max)
}

func readMax(f *os.File, path string, max int64) ([]byte, error) {
	data, err := io.ReadAll(io.LimitReader(f, max+1))
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	if int64(len(data)) > max {
		return nil, fmt.Errorf("%s is larger than %d bytes", path, max)
	}
	return data, nil
}

// ReadSecret is Read for a file that holds secrets, with the rules ssh
// applies to private keys: a file that is group- or world-writable, or
// owned by a user other than root and the user this process runs as, is
// refused (someone else could change the key); a world-readable file is
// read, with a warning to return to the operator.
func ReadSecret(path string, max int64) (data []byte, warning string, err error) {
	f, st, err := Open(path)
	if err != nil {
		return nil, "", err
	}
	defer f.Close()
	warning, err = secretMode(path, st, os.Geteuid())
	if err != nil {
		return nil, "", err
	}
	data, err = readMax(f, path, max)
	return data, warning, err
}

// secretMode applies the ownership and permission rules to st.
func secretMode(path string, st fs.FileInfo, euid int) (warning string, err error) {
	perm := st.Mode().Perm()
	if perm&0o022 != 0 {
		return "", fmt.Errorf("%s is group- or world-writable (mode %04o; chmod go-w): %w", path, perm, ErrUnsafe)
	}
	if sys, ok := st.Sys().(*syscall.Stat_t); ok && sys.Uid != 0 && int(sys.Uid) != euid {
		return "", fmt.Errorf("%s is owned by uid %d, neither root nor this process's uid %d: %w", path, sys.Uid, euid, ErrUnsafe)
	}
	if perm&0o004 != 0 {
		return fmt.Sprintf("%s is world-readable (mode %04o); chmod o-r keeps the secret to its owner and group", path, perm), nil
	}
	return "", nil
}
