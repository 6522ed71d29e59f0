package evloop

import (
	"runtime"
	"strings"
	"testing"

	"github.com/rl-tproxy/rl-tproxy/internal/testkit"
	"golang.org/x/sys/unix"
)

// loopWaitState returns the scheduler state of the goroutine running
// (*Loop).loop, as runtime.Stack prints it ("IO wait", "syscall", ...).
func loopWaitState() string {
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	for _, g := range strings.Split(string(buf), "\n\n") {
		if !strings.Contains(g, "evloop.(*Loop).loop(") {
			continue
		}
		head, _, _ := strings.Cut(g, "\n")
		if i, j := strings.Index(head, "["), strings.Index(head, "]"); i >= 0 && j > i {
			return head[i+1 : j]
		}
	}
	return ""
}

// TestIdleLoopParksInNetpoller: an idle loop waits in Go's netpoller (the
// goroutine is in "IO wait", its P free for other goroutines), and with
// BlockingWait inside the system call ("syscall", holding the P until the
// runtime retakes it). Both serve.
func TestIdleLoopParksInNetpoller(t *testing.T) {
	for _, tc := range []struct {
		name  string
		block bool
		state string
	}{
		{"netpoller", false, "IO wait"},
		{"blocking", true, "syscall"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			eachBackend(t, func(t *testing.T, be Backend) {
				g, err := Start(Config{Loops: 1, Backend: be, Logger: quietLogger(), BufSize: 4096, BlockingWait: tc.block})
				if err != nil {
					t.Fatalf("start: %v", err)
				}
				defer func() {
					if err := g.Close(); err != nil {
						t.Errorf("close: %v", err)
					}
				}()
				fd, addr := listenFD(t)
				listenAll(t, g, fd, func() Handler { return &echo{limit: 64 << 10} })
				c := dial(t, addr)
				if err := roundTrip(t, c, []byte("ping")); err != nil {
					t.Fatal(err)
				}
				testkit.WaitFor(t, "the idle loop to wait as "+tc.state, func() bool {
					return strings.HasPrefix(loopWaitState(), tc.state)
				})
				// A Post wakes it from there, and the loop serves again.
				on(g.Loops()[0], func() {})
				c.Close()
				if err := roundTrip(t, dial(t, addr), []byte("pong")); err != nil {
					t.Fatal(err)
				}
				waitStats(t, g, "sockets closed", func(s Stats) bool { return s.Sockets == 0 })
			})
		})
	}
}

// TestEpollParkSetOnlyWhileParked: an epoll loop's parker fd (the park
// set, which the netpoller watches) turns readable for the loop's events
// only while the loop parks, so a loop that runs or waits in the kernel
// holding its P never wakes a thread blocked in the netpoller. On the
// loop's thread, with a watched eventfd signalled (an event pending in
// the loop's set): the park set is not readable; armed as for a park it
// is; disarmed again it is not.
func TestEpollParkSetOnlyWhileParked(t *testing.T) {
	g := startGroup(t, Epoll, 1)
	l := g.Loops()[0]
	efd, err := unix.Eventfd(0, unix.EFD_NONBLOCK|unix.EFD_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(efd)
	var w *Watch
	on(l, func() { w, err = l.Watch(efd, func() {}) })
	if err != nil {
		t.Fatal(err)
	}
	defer on(l, w.Stop)
	readable := func() bool {
		pfd := []unix.PollFd{{Fd: int32(l.ep.parkfd), Events: unix.POLLIN}}
		n, err := unix.Poll(pfd, 0)
		if err != nil {
			t.Fatalf("poll the park set: %v", err)
		}
		return n > 0 && pfd[0].Revents&unix.POLLIN != 0
	}
	var running, armed, disarmed bool
	on(l, func() {
		if _, err = unix.Write(efd, eventfdOne[:]); err != nil {
			return
		}
		running = readable()
		if err = l.ep.armPark(); err != nil {
			return
		}
		armed = readable()
		l.ep.disarmPark()
		disarmed = readable()
	})
	if err != nil {
		t.Fatal(err)
	}
	if running || !armed || disarmed {
		t.Fatalf("park set readable with an event pending: running %v, armed for a park %v, disarmed %v; want false, true, false",
			running, armed, disarmed)
	}
}
