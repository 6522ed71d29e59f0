package testkit

import (
	"fmt"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// LeakBound bounds how long VerifyMain lets goroutines and descriptors of
// finished tests go away before it calls them leaked.
const LeakBound = 10 * time.Second

// VerifyMain is a package's TestMain body: it runs the tests and then
// fails the run when they left goroutines (go.uber.org/goleak, which tells
// a leaked goroutine from the runtime's own by its stack) or open file
// descriptors behind. ignoreTop names functions (as goleak's
// IgnoreTopFunction) whose goroutines legitimately outlive the tests.
// Leaks are only reported for a run that otherwise passed.
//
//	func TestMain(m *testing.M) { testkit.VerifyMain(m) }
func VerifyMain(m *testing.M, ignoreTop ...string) {
	os.Exit(verifyMain(m, ignoreTop))
}

func verifyMain(m *testing.M, ignoreTop []string) int {
	warmNetpoll()
	opts := []goleak.Option{goleak.IgnoreCurrent()}
	for _, f := range ignoreTop {
		opts = append(opts, goleak.IgnoreTopFunction(f))
	}
	before, err := openFDs()
	if err != nil {
		fmt.Fprintf(os.Stderr, "testkit: no descriptor leak check: %v\n", err)
	}
	code := m.Run()
	if code != 0 {
		return code
	}
	if err := goroutinesLeft(opts, LeakBound); err != nil {
		fmt.Fprintf(os.Stderr, "testkit: the tests left goroutines running (after %v): %v\n", LeakBound, err)
		code = 1
	}
	if before != nil {
		if extra := fdsLeft(before, LeakBound); len(extra) > 0 {
			fmt.Fprintf(os.Stderr, "testkit: the tests left %d file descriptors open (present after %v):\n  %s\n",
				len(extra), LeakBound, strings.Join(extra, "\n  "))
			code = 1
		}
	}
	return code
}

// goroutinesLeft asks goleak (which retries for about a second) until no
// goroutine is left or bound has passed.
func goroutinesLeft(opts []goleak.Option, bound time.Duration) error {
	deadline := time.Now().Add(bound)
	for {
		err := goleak.Find(opts...)
		if err == nil || time.Now().After(deadline) {
			return err
		}
	}
}

// warmNetpoll makes the runtime open its poller (epoll and event fds,
// kept for the process's life) before the descriptor baseline is taken.
func warmNetpoll() {
	if c, err := net.ListenPacket("udp", "127.0.0.1:0"); err == nil {
		c.Close()
	}
}

// openFDs maps each open descriptor of the process to what it refers to.
func openFDs() (map[int]string, error) {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return nil, fmt.Errorf("list open descriptors: %w", err)
	}
	fds := make(map[int]string, len(ents))
	for _, e := range ents {
		fd, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		target, err := os.Readlink("/proc/self/fd/" + e.Name())
		if err != nil { // closed since: the listing's own descriptor
			continue
		}
		fds[fd] = target
	}
	return fds, nil
}

// fdsLeft waits up to bound until no descriptor beyond before is open and
// returns the ones still open then ("fd -> target").
func fdsLeft(before map[int]string, bound time.Duration) []string {
	var extra []string
	deadline := time.Now().Add(bound)
	for {
		now, err := openFDs()
		if err != nil {
			return nil
		}
		extra = extra[:0]
		for fd, target := range now {
			if old, ok := before[fd]; !ok || old != target {
				extra = append(extra, fmt.Sprintf("%d -> %s", fd, target))
			}
		}
		if len(extra) == 0 || time.Now().After(deadline) {
			slices.Sort(extra)
			return extra
		}
		time.Sleep(maxPollGap)
	}
}

// CountFDs is the number of descriptors the process has open (ends t
// through Missing without /proc/self/fd).
func CountFDs(t testing.TB) int {
	t.Helper()
	fds, err := openFDs()
	if err != nil {
		Missing(t, "needs /proc/self/fd: %v", err)
	}
	return len(fds)
}
