package evloop

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/rl-tproxy/rl-tproxy/internal/testkit"
	"golang.org/x/sys/unix"
)

// TestPeerResetsMidWrite: the peer reads a little of a large response and
// resets; the writer gets OnError (not a hang, not a panic), the socket is
// released and its queue freed.
func TestPeerResetsMidWrite(t *testing.T) {
	eachBackend(t, func(t *testing.T, be Backend) {
		g := startGroup(t, be, 1)
		errs := make(chan error, 1)
		addr, _ := accepted(t, g, func() Handler {
			return &funcHandler{
				read: func(s *Sock, b []byte) { s.Write(make([]byte, 16<<20)) },
				fail: func(s *Sock, err error) { errs <- err },
				eof:  func(s *Sock) { errs <- io.EOF },
			}
		})
		c := dial(t, addr)
		c.Write([]byte("go"))
		readN(t, c, 64<<10)
		c.(*net.TCPConn).SetLinger(0)
		c.Close()
		err := <-errs
		if msg := err.Error(); !strings.Contains(msg, "reset") && !strings.Contains(msg, "broken pipe") {
			t.Fatalf("OnError(%v), want a reset or broken pipe", err)
		}
		waitStats(t, g, "reset socket released with its queue", func(s Stats) bool { return s.Sockets == 0 && s.Buffers == 0 })
	})
}

// floodEcho echoes with backpressure and records the most it ever held.
type floodEcho struct {
	limit   int
	read    atomic.Int64
	paused  atomic.Bool
	maxHeld atomic.Int64
}

func (f *floodEcho) OnConnect(*Sock, error) {}
func (f *floodEcho) OnEOF(s *Sock)          { s.Close() }
func (f *floodEcho) OnError(*Sock, error)   {}

func (f *floodEcho) OnRead(s *Sock, b []byte) {
	f.read.Add(int64(len(b)))
	s.Write(b)
	if held := int64(s.Pending() + len(s.stash)); held > f.maxHeld.Load() {
		f.maxHeld.Store(held)
	}
	if s.Pending() > f.limit {
		s.PauseRead()
		f.paused.Store(true)
	}
}

func (f *floodEcho) OnDrained(s *Sock) {
	f.paused.Store(false)
	s.ResumeRead()
}

// TestFloodWithoutReading: a peer sends 100 MB and never reads the
// echo. The loop stops reading once its queue passes the limit, so it
// holds at most the limit plus about one receive buffer (plus, with
// io_uring, what one turn's recv took before its cancel), and most of
// the 100 MB is never taken from the peer.
func TestFloodWithoutReading(t *testing.T) {
	eachBackend(t, func(t *testing.T, be Backend) {
		g := startGroup(t, be, 1)
		f := &floodEcho{limit: 256 << 10}
		addr, socks := accepted(t, g, func() Handler { return f })
		c := dial(t, addr)
		s := <-socks
		const total = 100 << 20
		wrote := make(chan int64, 1)
		go func() {
			chunk := make([]byte, 1<<20)
			var n int64
			for n < total {
				k, err := c.Write(chunk)
				n += int64(k)
				if err != nil {
					break
				}
			}
			wrote <- n
		}()
		testkit.WaitFor(t, "the loop to stop reading", func() bool { return f.paused.Load() })
		var kernelQueued int
		testkit.WaitFor(t, "the flood to back up into the kernel", func() bool {
			on(g.Loops()[0], func() { kernelQueued, _ = unix.IoctlGetInt(s.FD(), unix.SIOCINQ) })
			return kernelQueued > 0
		})
		bound := int64(f.limit + 4*DefaultBufSize + 4096*int(pbufEntries))
		if m := f.maxHeld.Load(); m > bound {
			t.Fatalf("held %d bytes in user space, bound %d", m, bound)
		}
		// The write queue's buffer, the one an in-flight send still reads
		// after the queue moved to a larger one (io_uring), the stash.
		if st := g.Stats(); st.Buffers > 3 {
			t.Fatalf("%d buffers held by one paused socket", st.Buffers)
		}
		c.Close() // unblocks the writer
		if n := <-wrote; n >= total {
			t.Fatalf("the peer wrote all %d bytes: nothing pushed back", n)
		}
		if r := f.read.Load(); r > 32<<20 {
			t.Fatalf("the loop read %d bytes of a flood it could not send back", r)
		}
		waitStats(t, g, "flooding socket released", func(s Stats) bool { return s.Sockets == 0 && s.Buffers == 0 })
	})
}

const idleChildEnv = "EVLOOP_IDLE_CLIENT"

// TestIdleConnectionsHoldNoBuffer: 10,000 connections that each made one
// exchange and went idle hold no buffer (Stats.Buffers counts receive and
// write buffers held by sockets). The clients live in a child process,
// so each process needs only one fd per connection.
func TestIdleConnectionsHoldNoBuffer(t *testing.T) {
	const n = 10_000
	if addr := os.Getenv(idleChildEnv); addr != "" {
		idleClients(t, addr, n)
		return
	}
	var rl unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &rl); err != nil || rl.Cur < n+500 {
		testkit.Missing(t, "RLIMIT_NOFILE %d below %d", rl.Cur, n+500)
	}
	eachBackend(t, func(t *testing.T, be Backend) {
		g := startGroup(t, be, 2)
		fd, addr := listenFD(t)
		listenAll(t, g, fd, func() Handler { return &echo{} })
		heap0 := heapAlloc()
		cmd := exec.Command(os.Args[0], "-test.run=^TestIdleConnectionsHoldNoBuffer$", "-test.count=1")
		cmd.Env = append(os.Environ(), idleChildEnv+"="+addr)
		stdin, _ := cmd.StdinPipe()
		stdout, _ := cmd.StdoutPipe()
		cmd.Stderr = os.Stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		defer cmd.Wait()
		defer stdin.Close()
		line, err := bufio.NewReader(stdout).ReadString('\n')
		if err != nil || line != "idle\n" {
			t.Fatalf("client process: %q, %v", line, err)
		}
		// The last echo's send completion may still be on its way to the
		// loop (its peer already has the byte): wait for the loop to catch
		// up, then nothing may be held.
		waitStats(t, g, fmt.Sprintf("%d idle connections holding no buffer", n), func(s Stats) bool {
			return s.Sockets == n && s.Buffers == 0
		})
		t.Logf("Go heap per idle connection (Sock, handler, table): %d B", (int64(heapAlloc())-int64(heap0))/n)
		stdin.Close() // the client process exits, its connections close
		waitStats(t, g, "all closed", func(s Stats) bool { return s.Sockets == 0 })
	})
}

// idleClients (in the child) opens n connections to addr, echoes one
// byte on each, prints "idle" and holds them until stdin closes.
func idleClients(t *testing.T, addr string, n int) {
	conns := make([]net.Conn, 0, n)
	var b [1]byte
	for i := 0; i < n; i++ {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatalf("connection %d: %v", i, err)
		}
		conns = append(conns, c)
		c.Write([]byte{byte(i)})
		if _, err := io.ReadFull(c, b[:]); err != nil || b[0] != byte(i) {
			t.Fatalf("connection %d echo: %v", i, err)
		}
	}
	os.Stdout.WriteString("idle\n")
	io.Copy(io.Discard, os.Stdin)
	for _, c := range conns {
		c.Close()
	}
}

func heapAlloc() uint64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

// TestTurnOverfillsSubmissionQueue: one turn writes to 3,000 sockets (and
// re-arms as many receives), more than io_uring's 1,024 SQ entries; every
// peer gets its bytes.
func TestTurnOverfillsSubmissionQueue(t *testing.T) {
	const n = 3000
	eachBackend(t, func(t *testing.T, be Backend) {
		g := startGroup(t, be, 1)
		addr, socks := accepted(t, g, func() Handler { return &funcHandler{eof: func(s *Sock) { s.Close() }} })
		conns := make([]net.Conn, n)
		all := make([]*Sock, 0, n)
		for i := range conns {
			conns[i] = dial(t, addr)
			all = append(all, <-socks)
		}
		on(g.Loops()[0], func() {
			for i, s := range all {
				s.Write([]byte{byte(i), byte(i >> 8)})
				s.PauseRead()
				s.ResumeRead()
			}
		})
		for i, c := range conns {
			b := readN(t, c, 2)
			if int(b[0])|int(b[1])<<8 != i&0xffff {
				t.Fatalf("conn %d got %v", i, b)
			}
			c.Close()
		}
		waitStats(t, g, "all closed", func(s Stats) bool { return s.Sockets == 0 && s.Buffers == 0 })
	})
}

// TestProvidedBuffersRunDry: with a ring of only two provided buffers,
// 16 connections echoing 256 KiB at once keep running the ring dry; each
// starved receive is re-armed when buffers return and every byte comes
// back.
func TestProvidedBuffersRunDry(t *testing.T) {
	if err := probeUring(); err != nil {
		testkit.Missing(t, "io_uring refused on this machine: %v", err)
	}
	defer func(n uint16) { pbufEntries = n }(pbufEntries)
	pbufEntries = 2
	g := startGroup(t, IOUring, 1)
	fd, addr := listenFD(t)
	listenAll(t, g, fd, func() Handler { return &echo{limit: 64 << 10} })
	errs := make(chan error, 16)
	for i := 0; i < 16; i++ {
		go func() {
			data := bytes.Repeat([]byte{byte(i)}, 256<<10)
			errs <- roundTrip(t, dial(t, addr), data)
		}()
	}
	for i := 0; i < 16; i++ {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	if st := g.Stats(); st.Starved == 0 {
		t.Fatal("the ring never ran dry: the test did not test ENOBUFS")
	}
	waitStats(t, g, "all closed", func(s Stats) bool { return s.Sockets == 0 && s.Buffers == 0 })
}
