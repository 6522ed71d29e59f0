package udpshard

import (
	"encoding/binary"
	"net/netip"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/rl-tproxy/rl-tproxy/internal/testkit"
)

// sendSegmented sends payload to dst as one UDP_SEGMENT message of seg-byte
// datagrams (the last may be shorter), as a GSO-sending server does.
func sendSegmented(t *testing.T, dst netip.AddrPort, payload []byte, seg int) {
	t.Helper()
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, unix.IPPROTO_UDP)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	oob := make([]byte, unix.CmsgSpace(2))
	cm := (*unix.Cmsghdr)(unsafe.Pointer(&oob[0]))
	cm.Level, cm.Type = unix.SOL_UDP, unix.UDP_SEGMENT
	cm.SetLen(unix.CmsgLen(2))
	*(*uint16)(unsafe.Pointer(&oob[unix.CmsgLen(0)])) = uint16(seg)
	sa := &unix.SockaddrInet4{Port: int(dst.Port()), Addr: dst.Addr().As4()}
	if err := unix.Sendmsg(fd, payload, oob, sa, 0); err != nil {
		testkit.Missing(t, "needs UDP segmentation (UDP_SEGMENT) on loopback: %v", err)
	}
}

// segmentedPayload is n datagrams of seg bytes and a last one of last
// bytes, each starting with its index and then a pattern.
func segmentedPayload(n, seg, last int) []byte {
	var p []byte
	for i := range n + 1 {
		size := seg
		if i == n {
			size = last
		}
		d := make([]byte, size)
		binary.BigEndian.PutUint32(d, uint32(i))
		for k := 4; k < size; k++ {
			d[k] = byte(i + k)
		}
		p = append(p, d...)
	}
	return p
}

type groRx struct {
	idx, size int
	ok        bool // pattern intact and capacity capped at the datagram
}

func runGROCase(t *testing.T, disable bool) Stats {
	t.Helper()
	const n, seg, last = 10, 100, 37
	got := make(chan groRx, 2*(n+1))
	r, err := New(Config{Bind: netip.MustParseAddr("127.0.0.1"), Shards: 1, DisableGRO: disable,
		Handler: func(_ *Socket, pkt []byte, _ netip.AddrPort) {
			i := int(binary.BigEndian.Uint32(pkt))
			ok := cap(pkt) == len(pkt)
			for k := 4; k < len(pkt); k++ {
				ok = ok && pkt[k] == byte(i+k)
			}
			got <- groRx{i, len(pkt), ok}
		}})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if !disable && !r.shards[0].cur.gro {
		testkit.Missing(t, "needs UDP_GRO on a UDP socket (Linux 5.0)")
	}
	sendSegmented(t, r.LocalAddr(0), segmentedPayload(n, seg, last), seg)
	for want := range n + 1 {
		select {
		case g := <-got:
			size := seg
			if want == n {
				size = last
			}
			if g.idx != want || g.size != size || !g.ok {
				t.Fatalf("datagram %+v, want index %d of %d bytes, intact and capped", g, want, size)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("datagram %d of %d never arrived", want, n+1)
		}
	}
	testkit.WaitFor(t, "counters", func() bool { return r.Stats().Received == n+1 })
	return r.Stats()
}

// TestGROSplitsCoalescedDatagrams: a segmented message arrives in one
// buffer (UDP_GRO) and is handed over as its datagrams, in order, each
// slice capped at its own end.
func TestGROSplitsCoalescedDatagrams(t *testing.T) {
	st := runGROCase(t, false)
	if st.GRODatagrams != 11 || st.RecvBatches != 1 {
		t.Fatalf("%d datagrams from coalesced buffers in %d read turns, want 11 in 1: %+v", st.GRODatagrams, st.RecvBatches, st)
	}
}

// TestGRODisabled: without UDP_GRO the kernel splits the message itself.
func TestGRODisabled(t *testing.T) {
	st := runGROCase(t, true)
	if st.GRODatagrams != 0 {
		t.Fatalf("%d datagrams from coalesced buffers with GRO off", st.GRODatagrams)
	}
}

// TestGROBuffersGivenBack: the mapped receive buffers of readers and of
// Drain are unmapped when the ring closes, and Drain after Close maps
// nothing again.
func TestGROBuffersGivenBack(t *testing.T) {
	before := mappedBatches.Load()
	r, err := New(Config{Bind: netip.MustParseAddr("127.0.0.1"), Shards: 2, Handler: func(*Socket, []byte, netip.AddrPort) {}})
	if err != nil {
		t.Fatal(err)
	}
	if !r.shards[0].cur.gro {
		r.Close()
		testkit.Missing(t, "needs UDP_GRO on a UDP socket (Linux 5.0)")
	}
	r.Drain(0) // maps shard 0's drain buffers
	if n := mappedBatches.Load() - before; n != 3 {
		t.Errorf("%d mappings for 2 readers and 1 drain, want 3", n)
	}
	r.Close()
	r.Drain(1)
	if n := mappedBatches.Load() - before; n != 0 {
		t.Fatalf("%d receive buffer mappings left after Close", n)
	}
}
