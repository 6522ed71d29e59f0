package rlserver

import (
	"encoding/binary"
	"net"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/rl-tproxy/rl-tproxy/internal/testkit"
	"github.com/rl-tproxy/rl-tproxy/pkg/ratelimitly/wire"
)

// gsoReply is one answer of a write turn: destination index and size.
type gsoReply struct {
	to, size int
}

// sendReplies puts replies in the send slots of a batchConn on loopback
// (an 8-byte index, then a pattern), sends them in one write turn and
// checks that each arrives once, whole, at its destination. prep runs on
// the conn's descriptor first.
func sendReplies(t *testing.T, prep func(fd int), replies []gsoReply) *batchConn {
	t.Helper()
	conn, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	b, err := newBatchConn(conn)
	if err != nil {
		t.Fatal(err)
	}
	if prep != nil {
		if err := b.rc.Control(func(fd uintptr) { prep(int(fd)) }); err != nil {
			t.Fatal(err)
		}
	}
	var dests []*net.UDPConn
	for range 2 {
		d, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
		if err != nil {
			t.Fatal(err)
		}
		defer d.Close()
		dests = append(dests, d)
	}
	for k, r := range replies {
		ap := dests[r.to].LocalAddr().(*net.UDPAddr).AddrPort()
		sa := (*unix.RawSockaddrInet4)(unsafe.Pointer(&b.rnames[k]))
		*sa = unix.RawSockaddrInet4{Family: unix.AF_INET, Addr: ap.Addr().As4()}
		binary.BigEndian.PutUint16((*[2]byte)(unsafe.Pointer(&sa.Port))[:], ap.Port())
		b.rhdrs[k].Hdr.Namelen = unix.SizeofSockaddrInet4
		b.setReply(k, k, r.size)
		binary.BigEndian.PutUint64(b.sbufs[k][:8], uint64(k))
		for i := 8; i < r.size; i++ {
			b.sbufs[k][i] = byte(k + i)
		}
	}
	failed, err := b.send(len(replies))
	if failed != 0 || err != nil {
		t.Fatalf("send: %d failed, %v", failed, err)
	}
	buf := make([]byte, 2048)
	seen := make([]bool, len(replies))
	for d, dc := range dests {
		want := 0
		for _, r := range replies {
			if r.to == d {
				want++
			}
		}
		for range want {
			if err := dc.SetReadDeadline(time.Now().Add(10 * time.Second)); err != nil {
				t.Fatal(err)
			}
			n, err := dc.Read(buf)
			if err != nil {
				t.Fatalf("destination %d: %v", d, err)
			}
			k := int(binary.BigEndian.Uint64(buf[:8]))
			if k >= len(replies) || seen[k] || replies[k].to != d || replies[k].size != n {
				t.Fatalf("destination %d got reply %d (%d bytes): unexpected", d, k, n)
			}
			for i := 8; i < n; i++ {
				if buf[i] != byte(k+i) {
					t.Fatalf("reply %d corrupted at byte %d", k, i)
				}
			}
			seen[k] = true
		}
	}
	return b
}

func TestRepliesSegmentedPerDestination(t *testing.T) {
	var rs []gsoReply
	for range 5 {
		rs = append(rs, gsoReply{0, 100})
	}
	for range 3 {
		rs = append(rs, gsoReply{1, 100})
	}
	rs = append(rs,
		gsoReply{0, 50},                   // alone: the next goes elsewhere
		gsoReply{1, 120}, gsoReply{1, 40}, // a short last segment closes the message
		gsoReply{1, 120},                     // alone
		gsoReply{0, 1300}, gsoReply{0, 1300}, // over gsoMaxSegSize: alone
		gsoReply{1, 8},
	)
	b := sendReplies(t, nil, rs)
	if b.gso.refused {
		testkit.Missing(t, "needs UDP segmentation (UDP_SEGMENT) on loopback; the kernel refused it (the fallback worked)")
	}
	// 5 + 3 + 2 datagrams in 3 segmented messages, 5 messages alone.
	if b.gso.segs.Load() != 10 || b.gso.n != 8 {
		t.Fatalf("%d datagrams in segmented messages and %d messages, want 10 and 8", b.gso.segs.Load(), b.gso.n)
	}
	// 64 answers of 1100 bytes (70400) exceed one IP packet: 54 in a first
	// message (gsoMaxBytes), 10 in a second, none refused.
	rs = rs[:0]
	for range 64 {
		rs = append(rs, gsoReply{0, 1100})
	}
	b = sendReplies(t, nil, rs)
	if b.gso.refused || b.gso.segs.Load() != 64 || b.gso.n != 2 {
		t.Fatalf("refused %v, %d segmented in %d messages; want 64 in 2", b.gso.refused, b.gso.segs.Load(), b.gso.n)
	}
}

func TestRepliesGSORefusedFallsBack(t *testing.T) {
	// The kernel refuses UDP_SEGMENT (EINVAL) on a socket with SO_NO_CHECK.
	noCheck := func(fd int) {
		if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_NO_CHECK, 1); err != nil {
			testkit.Missing(t, "needs SO_NO_CHECK on a UDP socket: %v", err)
		}
	}
	var rs []gsoReply
	for range 12 {
		rs = append(rs, gsoReply{0, 200}, gsoReply{0, 200}, gsoReply{1, 120})
	}
	b := sendReplies(t, noCheck, rs)
	if !b.gso.refused || b.gso.segs.Load() != 0 {
		t.Fatalf("refused %v, %d segmented: want the fallback, every reply sent alone", b.gso.refused, b.gso.segs.Load())
	}
	// Once refused, the socket no longer tries.
	rs = rs[:4]
	b2 := sendReplies(t, noCheck, rs)
	if !b2.gso.refused {
		t.Fatal("a second conn on a refusing socket did not fall back")
	}
}

// TestRepliesSegmentedThroughServer: a client sending a burst from one
// socket gets every answer once, as separate datagrams, however the
// server's read turns happened to group them.
func TestRepliesSegmentedThroughServer(t *testing.T) {
	clk := newClock()
	s := startServer(t, clk, func(c *Config) { c.Workers = 1 })
	c := newClient(t, s, clk, testCred("acme", 1, 1))
	const n = 48
	for i := range n {
		h := c.header(uint64(i + 1))
		c.send(c.seal(&h, oneRes(res("burst", 1000, 1000, 100, 1))))
	}
	got := make(map[uint64]bool)
	for len(got) < n {
		h, r, _ := c.recv()
		if h.RequestID == 0 || h.RequestID > n || got[h.RequestID] || r.Status != wire.StatusOK {
			t.Fatalf("unexpected answer %d (status %d)", h.RequestID, r.Status)
		}
		got[h.RequestID] = true
	}
	t.Logf("answers sent inside segmented messages: %d of %d", s.workers[0].bc.gso.segs.Load(), n)
}
