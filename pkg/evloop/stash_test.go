package evloop

import (
	"bytes"
	"testing"
	"time"

	"github.com/rl-tproxy/rl-tproxy/internal/testkit"
)

// pausingReader pauses its socket in every OnRead and reports each one;
// the test resumes it. It runs on the loop thread only.
type pausingReader struct {
	bufSize  int
	got      []byte
	tooBig   int // the largest OnRead above bufSize, 0 if none
	reads    chan int
	maxStash int
}

func (p *pausingReader) OnConnect(*Sock, error) {}
func (p *pausingReader) OnEOF(*Sock)            {}
func (p *pausingReader) OnError(*Sock, error)   {}
func (p *pausingReader) OnDrained(*Sock)        {}

func (p *pausingReader) OnRead(s *Sock, b []byte) {
	if len(b) > p.bufSize {
		p.tooBig = max(p.tooBig, len(b))
	}
	p.got = append(p.got, b...)
	s.PauseRead()
	select {
	case p.reads <- len(b):
	default:
	}
}

// TestPausedReadDeliveredInPieces: a handler that pauses in every OnRead
// while its peer sends megabytes gets every byte, in order, never more
// than BufSize in one OnRead, and exactly one OnRead per ResumeRead (the
// bytes stashed meanwhile wait for the next one). What a paused socket
// holds in user space stays within one receive burst (io_uring: what one
// recv may take, recvBurst buffers; epoll: nothing).
func TestPausedReadDeliveredInPieces(t *testing.T) {
	eachBackend(t, func(t *testing.T, be Backend) {
		g := startGroup(t, be, 1)
		bound := 0
		if be == IOUring {
			bound = recvBurst * g.Loops()[0].bufSize
		}
		if maxStash := pausedPieces(t, g); maxStash > bound {
			t.Fatalf("a paused socket stashed %d bytes, bound %d", maxStash, bound)
		}
		if be == IOUring && g.Loops()[0].ur.recvLimit == 0 {
			t.Fatal("the kernel refused the recv limit")
		}
	})
}

// TestRecvLimitRefused: on a kernel that refuses the multishot recv
// limit (EINVAL), the loop reads on without it; nothing is lost.
func TestRecvLimitRefused(t *testing.T) {
	if err := probeUring(); err != nil {
		testkit.Missing(t, "io_uring refused on this machine: %v", err)
	}
	refuseRecvLimit = true
	defer func() { refuseRecvLimit = false }()
	g := startGroup(t, IOUring, 1)
	pausedPieces(t, g)
	var limit int
	on(g.Loops()[0], func() { limit = g.Loops()[0].ur.recvLimit })
	if limit != 0 || refuseRecvLimit {
		t.Fatalf("recv limit %d after the kernel refused it (hook still armed: %v)", limit, refuseRecvLimit)
	}
}

// pausedPieces streams 4 MiB to a socket of g's first loop whose handler
// pauses in every OnRead, resumes it once per OnRead, checks what
// arrives, and returns the largest stash seen at a resume.
func pausedPieces(t *testing.T, g *Group) int {
	const size = 4 << 20
	l := g.Loops()[0]
	p := &pausingReader{bufSize: l.bufSize, reads: make(chan int, 1)}
	addr, socks := accepted(t, g, func() Handler { return p })
	c := dial(t, addr)
	s := <-socks
	data := bytes.Repeat([]byte("0123456789abcdefghijklmnopqrstuv"), size/32)
	werr := make(chan error, 1)
	go func() { _, err := c.Write(data); werr <- err }()
	for total := 0; total < size; {
		select {
		case n := <-p.reads:
			total += n
		case <-time.After(testkit.WaitBound):
			t.Fatalf("no OnRead after %d of %d bytes", total, size)
		}
		var extra bool
		on(l, func() {
			p.maxStash = max(p.maxStash, len(s.stash))
			select { // exactly one OnRead per resume
			case <-p.reads:
				extra = true
			default:
			}
			s.ResumeRead()
		})
		if extra {
			t.Fatalf("an OnRead came while the socket was paused (after %d bytes)", total)
		}
	}
	if err := <-werr; err != nil {
		t.Fatal(err)
	}
	var got []byte
	var tooBig, maxStash int
	on(l, func() { got, tooBig, maxStash = p.got, p.tooBig, p.maxStash })
	t.Logf("largest stash at a resume: %d bytes", maxStash)
	if tooBig > 0 {
		t.Fatalf("one OnRead delivered %d bytes, more than BufSize %d", tooBig, l.bufSize)
	}
	if !bytes.Equal(got, data) {
		t.Fatalf("received %d bytes differing from the %d sent", len(got), len(data))
	}
	return maxStash
}
