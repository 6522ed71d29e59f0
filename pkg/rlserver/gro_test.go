package rlserver

import (
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/rl-tproxy/rl-tproxy/internal/testkit"
)

// sendSegmented sends msgs from c's socket in one sendmmsg, each message
// its requests as UDP_SEGMENT segments of seg bytes (as pkg/rlclient
// sends a batch to one node). It skips when the kernel refuses UDP GSO.
func sendSegmented(t *testing.T, c *tclient, msgs [][]byte, seg int) {
	t.Helper()
	rc, err := c.conn.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	hdrs := make([]unix.Mmsghdr, len(msgs))
	iovs := make([]unix.Iovec, len(msgs))
	ctrl := make([]byte, len(msgs)*gsoCmsgSpace)
	for i, m := range msgs {
		iovs[i].Base = &m[0]
		iovs[i].SetLen(len(m))
		hdrs[i].Hdr.Iov = &iovs[i]
		hdrs[i].Hdr.SetIovlen(1)
		cb := ctrl[i*gsoCmsgSpace : (i+1)*gsoCmsgSpace]
		cm := (*unix.Cmsghdr)(unsafe.Pointer(&cb[0]))
		cm.Level, cm.Type = unix.SOL_UDP, unix.UDP_SEGMENT
		cm.SetLen(unix.CmsgLen(2))
		*(*uint16)(unsafe.Pointer(&cb[unix.CmsgLen(0)])) = uint16(seg)
		hdrs[i].Hdr.Control = &cb[0]
		hdrs[i].Hdr.SetControllen(gsoCmsgSpace)
	}
	var n int
	var e unix.Errno
	if err := rc.Write(func(fd uintptr) bool {
		r, _, errno := unix.Syscall6(unix.SYS_SENDMMSG, fd, uintptr(unsafe.Pointer(&hdrs[0])), uintptr(len(hdrs)), 0, 0, 0)
		n, e = int(r), errno
		return errno != unix.EAGAIN
	}); err != nil {
		t.Fatal(err)
	}
	if e != 0 && gsoRefused(e) {
		t.Skipf("UDP GSO refused by the kernel: %v", e)
	}
	if e != 0 || n != len(msgs) {
		t.Fatalf("sendmmsg: %d of %d messages, %v", n, len(msgs), e)
	}
}

// TestCoalescedRequests: requests sent as segmented messages (which a
// socket with UDP_GRO receives whole on loopback) are each decided and
// answered once, including as many answers in one read turn as a write
// turn has slots, and a shorter last segment.
func TestCoalescedRequests(t *testing.T) {
	for _, tc := range []struct {
		name       string
		batch      int
		msgs, segs int
	}{
		{"one message", 0, 1, 5},
		{"a full write turn", 0, 1, 63},
		{"two messages", 0, 2, 50},
		{"batch 1", 1, 3, 30},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clk := newClock()
			s := startServer(t, clk, func(c *Config) { c.Workers = 1; c.Batch = tc.batch })
			c := newClient(t, s, clk, testCred("acme", 1, 1))
			req := oneRes(res("coalesced", 1000, 1000, 1000, 1))
			var msgs [][]byte
			seg, want := 0, map[uint64]bool{}
			for range tc.msgs {
				var m []byte
				for range tc.segs {
					c.next++
					h := c.header(c.next)
					p := c.seal(&h, req)
					if seg == 0 {
						seg = len(p)
					}
					if len(p) != seg {
						t.Fatalf("sealed request of %d bytes, want all %d", len(p), seg)
					}
					m = append(m, p...)
					want[c.next] = true
				}
				msgs = append(msgs, m)
			}
			// a last, shorter segment: a request with a shorter bucket name
			c.next++
			h := c.header(c.next)
			short := c.seal(&h, oneRes(res("c", 1000, 1000, 1000, 1)))
			if len(short) >= seg {
				t.Fatalf("short request of %d bytes, not below %d", len(short), seg)
			}
			msgs[len(msgs)-1] = append(msgs[len(msgs)-1], short...)
			want[c.next] = true
			sendSegmented(t, c, msgs, seg)
			for range want {
				rh, r, _ := c.recv()
				if !want[rh.RequestID] || !r.Success {
					t.Fatalf("answer for id %d (success %v): unexpected or repeated", rh.RequestID, r.Success)
				}
				delete(want, rh.RequestID)
			}
			n := uint64(tc.msgs*tc.segs + 1)
			// the worker counts its answers after the send returns
			testkit.WaitFor(t, "responses counted", func() bool { return s.Stats().Responses >= n })
			st := s.Stats()
			if st.Received != n || st.Requests != n || st.Responses != n {
				t.Fatalf("received %d, requests %d, responses %d; want %d each", st.Received, st.Requests, st.Responses, n)
			}
			gro := s.workers[0].bc.gro
			t.Logf("UDP_GRO %v, %d of %d datagrams coalesced, %d read turns", gro, st.Coalesced, n, st.ReadBatches)
			if gro && st.Coalesced == 0 {
				t.Fatalf("UDP_GRO on but no datagram arrived coalesced")
			}
		})
	}
}

// TestNextDatagram cuts coalesced messages at the segment size.
func TestNextDatagram(t *testing.T) {
	for _, tc := range []struct {
		msg  string
		seg  int
		want []string
	}{
		{"abcdef", 0, []string{"abcdef"}},
		{"abcdef", 2, []string{"ab", "cd", "ef"}},
		{"abcde", 2, []string{"ab", "cd", "e"}},
		{"abc", 3, []string{"abc"}},
		{"abc", 7, []string{"abc"}},
		{"abc", -1, []string{"abc"}},
	} {
		var got []string
		for rest := []byte(tc.msg); len(rest) > 0; {
			var pkt []byte
			pkt, rest = nextDatagram(rest, tc.seg)
			got = append(got, string(pkt))
		}
		if len(got) != len(tc.want) {
			t.Fatalf("%q / %d: %q, want %q", tc.msg, tc.seg, got, tc.want)
		}
		for i := range got {
			if got[i] != tc.want[i] {
				t.Fatalf("%q / %d: %q, want %q", tc.msg, tc.seg, got, tc.want)
			}
		}
	}
}
