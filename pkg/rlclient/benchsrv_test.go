package rlclient

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/rl-tproxy/rl-tproxy/internal/dnstest"
	"github.com/rl-tproxy/rl-tproxy/internal/testkit/rlcluster"
	"github.com/rl-tproxy/rl-tproxy/pkg/ratelimitly/credentials"
	"github.com/rl-tproxy/rl-tproxy/pkg/rlserver"
)

// The benchmarks that compare clients (Rings256*, Naive256) run their
// rlserver nodes in a child process (this test binary again, whose TestMain
// runs benchServerMain instead of the tests), so that the client's CPU time per decision is
// the benchmark process's own getrusage and the server's is measured
// apart. Both clients talk to the same kind of child.
const (
	// benchServerEnv holds the number of nodes the child starts; when it
	// is set, TestMain runs benchServerMain instead of the tests.
	benchServerEnv = "RLCLIENT_BENCH_SERVER"
	// benchServerCPUEnv, if set (e.g. "1"), pins the server child to that
	// CPU (run the benchmark itself under taskset on another one).
	benchServerCPUEnv = "RLBENCH_SERVER_CPU"
	// benchSyscallsEnv=1 turns on syscalls/op. It is off by default: the
	// active tracepoint adds to the cost of every system call, which
	// would bill the naive client (ten times more calls) more than the
	// rings; compare CPU from runs without it.
	benchSyscallsEnv = "RLBENCH_SYSCALLS"
)

// benchCluster is a set of rlserver nodes in a child process, published by
// an in-process DNS server.
type benchCluster struct {
	dns   *dnstest.Server
	addrs []netip.AddrPort
	cmd   *exec.Cmd
	in    io.WriteCloser
	out   *bufio.Scanner
}

// startBenchCluster starts nodes rlserver nodes (one worker each) in a
// child process; they stop when the benchmark ends.
func startBenchCluster(b *testing.B, nodes int) *benchCluster {
	b.Helper()
	exe, err := os.Executable()
	if err != nil {
		b.Fatalf("bench server: %v", err)
	}
	cmd := exec.Command(exe)
	cmd.Env = append(os.Environ(), benchServerEnv+"="+strconv.Itoa(nodes))
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		b.Fatalf("bench server: %v", err)
	}
	outPipe, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatalf("bench server: %v", err)
	}
	if err := cmd.Start(); err != nil {
		b.Fatalf("bench server: start %s: %v", exe, err)
	}
	bc := &benchCluster{cmd: cmd, in: in, out: bufio.NewScanner(outPipe)}
	b.Cleanup(func() {
		in.Close() // the child stops its nodes and exits on EOF
		io.Copy(io.Discard, outPipe)
		if err := cmd.Wait(); err != nil {
			b.Errorf("bench server: %v", err)
		}
	})
	for len(bc.addrs) < nodes {
		line := bc.line(b)
		a, ok := strings.CutPrefix(line, "addr ")
		if !ok {
			continue // the test framework's own output
		}
		ap, err := netip.ParseAddrPort(a)
		if err != nil {
			b.Fatalf("bench server: %q: %v", line, err)
		}
		bc.addrs = append(bc.addrs, ap)
	}
	bc.dns = dnstest.Start(b)
	bc.dns.SetSRV(testSRV, rlcluster.Targets("rl.test.", bc.addrs...)...)
	return bc
}

func (bc *benchCluster) line(b *testing.B) string {
	if !bc.out.Scan() {
		b.Fatalf("bench server: exited early: %v", bc.out.Err())
	}
	return bc.out.Text()
}

// cpu is the server process's user+system CPU time so far.
func (bc *benchCluster) cpu(b *testing.B) time.Duration {
	if _, err := io.WriteString(bc.in, "cpu\n"); err != nil {
		b.Fatalf("bench server: %v", err)
	}
	for {
		v, ok := strings.CutPrefix(bc.line(b), "cpu ")
		if !ok {
			continue
		}
		ns, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			b.Fatalf("bench server: cpu %q: %v", v, err)
		}
		return time.Duration(ns)
	}
}

// benchServerMain is the server child of the client benchmarks (TestMain
// runs it instead of the tests when benchServerEnv is set). It prints the
// nodes' addresses, answers "cpu" lines on stdin with its CPU time, and
// stops the nodes and returns 0 when stdin closes.
func benchServerMain(nodesEnv string) int {
	fail := func(format string, args ...any) int {
		fmt.Fprintf(os.Stderr, "bench server: "+format+"\n", args...)
		return 1
	}
	nodes, err := strconv.Atoi(nodesEnv)
	if err != nil || nodes < 1 || nodes > 16 {
		return fail("%s=%q: want 1..16 nodes", benchServerEnv, nodesEnv)
	}
	if c := os.Getenv(benchServerCPUEnv); c != "" {
		cpu, err := strconv.Atoi(c)
		if err != nil {
			return fail("%s=%q: %v", benchServerCPUEnv, c, err)
		}
		if err := pinProcess(cpu); err != nil {
			return fail("%v", err)
		}
	}
	var servers []*rlserver.Server
	defer func() {
		for _, s := range servers {
			s.Close()
		}
	}()
	for range nodes {
		s, err := rlserver.Start(rlserver.Config{Listen: "127.0.0.1:0", Workers: 1,
			Credentials: []credentials.Credential{testCred()}})
		if err != nil {
			return fail("rlserver: %v", err)
		}
		servers = append(servers, s)
		fmt.Printf("addr %s\n", s.Addr())
	}
	sc := bufio.NewScanner(os.Stdin)
	for sc.Scan() {
		if sc.Text() == "cpu" {
			fmt.Printf("cpu %d\n", cpuTime().Nanoseconds())
		}
	}
	return 0
}

// pinProcess moves every thread of the process to cpu (threads started
// later inherit it from the thread that creates them).
func pinProcess(cpu int) error {
	var set unix.CPUSet
	set.Set(cpu)
	tasks, err := os.ReadDir("/proc/self/task")
	if err != nil {
		return fmt.Errorf("pin to cpu %d: %w", cpu, err)
	}
	for _, t := range tasks {
		tid, err := strconv.Atoi(t.Name())
		if err != nil {
			continue
		}
		if err := unix.SchedSetaffinity(tid, &set); err != nil && err != unix.ESRCH {
			return fmt.Errorf("pin thread %d to cpu %d: %w", tid, cpu, err)
		}
	}
	return nil
}

// syscallCounter counts the system calls of this process
// (raw_syscalls:sys_enter) with perf_event_open: one counter per thread
// that exists when it starts, inherited by the threads those create. The
// server child was started before, so it is not counted. Without perf
// events (no tracefs, no permission), or without benchSyscallsEnv=1, it
// counts nothing and reports -1.
type syscallCounter struct {
	fds []int
}

func startSyscallCounter() *syscallCounter {
	sc := &syscallCounter{}
	if os.Getenv(benchSyscallsEnv) != "1" {
		return sc
	}
	idb, err := os.ReadFile("/sys/kernel/tracing/events/raw_syscalls/sys_enter/id")
	if err != nil {
		return sc
	}
	id, err := strconv.ParseUint(strings.TrimSpace(string(idb)), 10, 64)
	if err != nil {
		return sc
	}
	tasks, err := os.ReadDir("/proc/self/task")
	if err != nil {
		return sc
	}
	for _, t := range tasks {
		tid, err := strconv.Atoi(t.Name())
		if err != nil {
			continue
		}
		attr := unix.PerfEventAttr{Type: unix.PERF_TYPE_TRACEPOINT, Config: id,
			Size: uint32(unsafe.Sizeof(unix.PerfEventAttr{})), Bits: unix.PerfBitInherit}
		fd, err := unix.PerfEventOpen(&attr, tid, -1, -1, unix.PERF_FLAG_FD_CLOEXEC)
		if err != nil {
			sc.close()
			return &syscallCounter{}
		}
		sc.fds = append(sc.fds, fd)
	}
	return sc
}

// stop closes the counters and returns the system calls counted, or -1.
func (sc *syscallCounter) stop() int64 {
	if len(sc.fds) == 0 {
		return -1
	}
	var total int64
	var buf [8]byte
	for _, fd := range sc.fds {
		if n, err := unix.Read(fd, buf[:]); err == nil && n == 8 {
			total += int64(binary.NativeEndian.Uint64(buf[:]))
		}
	}
	sc.close()
	return total
}

func (sc *syscallCounter) close() {
	for _, fd := range sc.fds {
		unix.Close(fd)
	}
	sc.fds = nil
}
