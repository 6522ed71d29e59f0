package evloop

import (
	"bytes"
	"crypto/rand"
	"log/slog"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"testing"
	"unsafe"

	"github.com/rl-tproxy/rl-tproxy/internal/testkit"
	"golang.org/x/sys/unix"
)

// autoFallsBack starts an Auto group of two loops, checks it runs epoll,
// logged the refusal exactly once and serves an echo.
func autoFallsBack(t *testing.T, want string) {
	t.Helper()
	var logs testkit.SyncBuffer
	g, err := Start(Config{Loops: 2, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatalf("Auto with io_uring refused: %v", err)
	}
	defer g.Close()
	if g.Backend() != Epoll {
		t.Fatalf("Auto runs %s with io_uring refused, want epoll", g.Backend())
	}
	lines := strings.Split(strings.TrimSpace(logs.String()), "\n")
	if len(lines) != 1 || !strings.Contains(lines[0], "io_uring refused") || !strings.Contains(lines[0], want) {
		t.Fatalf("want one log line about %q, got %q", want, logs.String())
	}
	fd, addr := listenFD(t)
	listenAll(t, g, fd, func() Handler { return &echo{} })
	data := make([]byte, 100_000)
	rand.Read(data)
	if err := roundTrip(t, dial(t, addr), data); err != nil {
		t.Fatal(err)
	}
}

// TestAutoFallsBack: io_uring_setup failing (the test hook) makes Auto run
// epoll and log it once; an explicit IOUring fails to start instead.
func TestAutoFallsBack(t *testing.T) {
	uringSetupHook = func() error { return unix.EPERM }
	defer func() { uringSetupHook = nil }()
	autoFallsBack(t, "operation not permitted")
	if _, err := Start(Config{Backend: IOUring, Logger: quietLogger()}); err == nil {
		t.Fatal("Backend IOUring started with io_uring refused")
	}
}

// TestAutoPicksUring: with io_uring available Auto runs it, silently.
func TestAutoPicksUring(t *testing.T) {
	if err := probeUring(); err != nil {
		testkit.Missing(t, "io_uring refused on this machine: %v", err)
	}
	var logs testkit.SyncBuffer
	g, err := Start(Config{Loops: 1, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	if g.Backend() != IOUring || logs.String() != "" {
		t.Fatalf("Auto runs %s and logged %q, want io_uring and nothing", g.Backend(), logs.String())
	}
}

const seccompChildEnv = "EVLOOP_SECCOMP_CHILD"

// TestSeccompFallback: the real refusal a container runtime's default
// profile makes. A child process of this test installs a seccomp filter
// that fails io_uring_setup with EPERM on all its threads, then starts an
// Auto group: it must run epoll, log once and serve.
func TestSeccompFallback(t *testing.T) {
	if os.Getenv(seccompChildEnv) == "1" {
		if err := refuseUringSetup(); err != nil {
			t.Fatalf("install seccomp filter: %v", err)
		}
		if err := probeUring(); err == nil {
			t.Fatal("io_uring_setup still works under the filter")
		}
		autoFallsBack(t, "operation not permitted")
		return
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestSeccompFallback$", "-test.count=1", "-test.v")
	cmd.Env = append(os.Environ(), seccompChildEnv+"=1")
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "--- PASS: TestSeccompFallback") {
		t.Fatalf("child under seccomp: %v\n%s", err, out)
	}
}

// refuseUringSetup installs a seccomp filter on every thread of the
// process: io_uring_setup fails with EPERM, everything else is allowed.
func refuseUringSetup() error {
	runtime.LockOSThread() // the filter goes to all threads (TSYNC) anyway
	defer runtime.UnlockOSThread()
	const (
		ldW  = unix.BPF_LD | unix.BPF_W | unix.BPF_ABS
		jeqK = unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K
		retK = unix.BPF_RET | unix.BPF_K
	)
	prog := []unix.SockFilter{
		{Code: ldW, K: 0}, // seccomp_data.nr
		{Code: jeqK, Jt: 0, Jf: 1, K: sysIOUringSetup},
		{Code: retK, K: unix.SECCOMP_RET_ERRNO | uint32(unix.EPERM)},
		{Code: retK, K: unix.SECCOMP_RET_ALLOW},
	}
	fprog := unix.SockFprog{Len: uint16(len(prog)), Filter: &prog[0]}
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		return err
	}
	_, _, e := unix.Syscall(unix.SYS_SECCOMP, unix.SECCOMP_SET_MODE_FILTER, unix.SECCOMP_FILTER_FLAG_TSYNC,
		uintptr(unsafe.Pointer(&fprog)))
	if e != 0 {
		return e
	}
	return nil
}

// TestDetachUnderLoad: the peer keeps sending while the socket detaches;
// the bytes OnRead saw, then Unread, then what the fd reads are exactly
// the stream (io_uring's recv may take bytes before its cancel).
func TestDetachUnderLoad(t *testing.T) {
	eachBackend(t, func(t *testing.T, be Backend) {
		g := startGroup(t, be, 1)
		stream := make([]byte, 4<<20)
		rand.Read(stream)
		var got bytes.Buffer // loop thread until the detach, then the reader
		done := make(chan error, 1)
		addr, _ := accepted(t, g, func() Handler {
			return &funcHandler{read: func(s *Sock, b []byte) {
				got.Write(b)
				if got.Len() < 64<<10 {
					return
				}
				s.Detach(func(fd int, err error) {
					if err != nil {
						done <- err
						return
					}
					got.Write(s.Unread())
					go func() {
						f := os.NewFile(uintptr(fd), "detached")
						defer f.Close()
						_, err := got.ReadFrom(f)
						done <- err
					}()
				})
			}}
		})
		c := dial(t, addr)
		go func() {
			c.Write(stream)
			c.Close()
		}()
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got.Bytes(), stream) {
			t.Fatalf("got %d bytes, want the %d-byte stream unchanged", got.Len(), len(stream))
		}
	})
}

// TestDetachUntakenUnreadIsLogged: io_uring's multishot recv delivers a
// burst as many completions in one turn; a Detach from the first OnRead
// leaves the rest in Unread. A callback that does not take them gets an
// error in the log (the bytes are lost), one that does gets them all.
func TestDetachUntakenUnreadIsLogged(t *testing.T) {
	if err := probeUring(); err != nil {
		testkit.Missing(t, "io_uring refused on this machine: %v", err)
	}
	for _, take := range []bool{false, true} {
		var logs testkit.SyncBuffer
		g, err := Start(Config{Loops: 1, Backend: IOUring, BufSize: 4096, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
		if err != nil {
			t.Fatal(err)
		}
		l := g.Loops()[0]
		var seen, unread int
		done := make(chan struct{})
		addr, socks := accepted(t, g, func() Handler {
			return &funcHandler{read: func(s *Sock, b []byte) {
				seen += len(b)
				s.Detach(func(fd int, err error) {
					if take {
						unread = len(s.Unread())
					}
					unix.Close(fd)
					close(done)
				})
			}}
		})
		c := dial(t, addr)
		s := <-socks
		on(l, func() { s.PauseRead() })
		on(l, func() {}) // the cancel went in with this turn's submit
		on(l, func() {})
		burst := make([]byte, 1<<20)
		go c.Write(burst)
		testkit.WaitFor(t, "the burst queued in the kernel", func() bool {
			var n int
			on(l, func() {
				if s.FD() < 0 {
					t.Fatal("paused socket read and detached")
				}
				n, _ = unix.IoctlGetInt(s.FD(), unix.SIOCINQ)
			})
			return n >= 32<<10
		})
		on(l, func() { s.ResumeRead() })
		<-done
		g.Close()
		logged := strings.Contains(logs.String(), "must take Sock.Unread")
		switch {
		case take && (logged || unread == 0):
			t.Fatalf("Unread taken: %d bytes, logged %v (%q)", unread, logged, logs.String())
		case !take && !logged:
			t.Fatalf("Unread left: nothing logged (%q)", logs.String())
		}
		t.Logf("take=%v: OnRead saw %d bytes, Unread held %d", take, seen, unread)
	}
}
