package udpshard

import (
	"encoding/binary"
	"errors"
	"net"
	"os/exec"
	"slices"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/rl-tproxy/rl-tproxy/internal/netnstest"
	"github.com/rl-tproxy/rl-tproxy/internal/testkit"
)

// TestRequeueKeepsOrder: what a full send buffer left unsent goes back to
// the head of the queue in its order, ahead of what was queued during the
// flush; what does not fit (the newest) is refused and reported.
func TestRequeueKeepsOrder(t *testing.T) {
	cases := []struct {
		name    string
		n       int   // datagrams in the flushed batch (tokens 0..n-1)
		keep    []int // marked keep before stop
		stop    int
		queued  int // pushed during the flush (tokens 100..)
		want    []uint64
		refused []uint64
	}{
		{"nothing sent", 4, nil, 0, 0, []uint64{0, 1, 2, 3}, nil},
		{"tail of a run", 6, []int{3}, 4, 0, []uint64{3, 4, 5}, nil},
		{"gaps of a segmented run", 6, []int{1, 3}, 4, 2, []uint64{1, 3, 4, 5, 100, 101}, nil},
		{"overflow refuses the newest", 6, nil, 2, 5, []uint64{2, 3, 4, 5, 100, 101, 102, 103}, []uint64{104}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var mu sync.Mutex
			var refused []uint64
			r := newOwnedRing(t, Config{Bind: loopback4, Shards: 1, Owned: 1, QueueLen: 8,
				OnSendError: func(tok uint64, err error) {
					if !errors.Is(err, unix.EAGAIN) {
						t.Errorf("refused with %v, want EAGAIN", err)
					}
					mu.Lock()
					refused = append(refused, tok)
					mu.Unlock()
				}}, func(*Socket, []byte, netipAddrPort) {})
			s := r.shards[0]
			s.mu.Lock()
			batch := s.q
			s.q, s.spare = s.spare, batch
			for i := range tc.n {
				batch[i] = sendSlot{sock: s.cur, token: uint64(i), n: 1}
			}
			for _, k := range tc.keep {
				batch[k].keep = true
			}
			for i := range tc.queued {
				s.q[i] = sendSlot{sock: s.cur, token: uint64(100 + i), n: 1}
			}
			s.qn = tc.queued
			s.requeueLocked(batch, tc.n, tc.stop)
			var got []uint64
			for _, sl := range s.q[:s.qn] {
				got = append(got, sl.token)
				if sl.keep {
					t.Error("a requeued slot is still marked keep")
				}
			}
			s.mu.Unlock()
			if !slices.Equal(got, tc.want) {
				t.Fatalf("queue %v, want %v", got, tc.want)
			}
			s.deliverErrors()
			mu.Lock()
			defer mu.Unlock()
			if !slices.Equal(refused, tc.refused) {
				t.Fatalf("refused %v, want %v", refused, tc.refused)
			}
			if st := r.Stats(); st.Dropped.QueueFull != uint64(len(tc.refused)) || st.SendBlocked != 1 {
				t.Fatalf("queue-full drops %d, blocked flushes %d", st.Dropped.QueueFull, st.SendBlocked)
			}
		})
	}
}

// slowLoopback is a network namespace whose loopback device is shaped by
// a token bucket (tbf) of the given rate: datagrams wait in the qdisc,
// charged to the sender's socket, so a socket with a minimal send buffer
// gets EAGAIN for real.
func slowLoopback(t *testing.T, rate string) *netnstest.NS {
	t.Helper()
	ns := netnstest.New(t)
	tc := testkit.NeedTool(t, "tc", "iproute2")
	out, err := exec.Command(tc, "-n", ns.Name, "qdisc", "replace", "dev", "lo", "root",
		"tbf", "rate", rate, "burst", "1600", "limit", "1000000").CombinedOutput()
	if err != nil {
		testkit.Missing(t, "a tbf qdisc on loopback (kernel sch_tbf): %v: %s", err, out)
	}
	return ns
}

// blockedRing opens, inside ns, an owned ring whose socket has the
// smallest send buffer, and a peer socket.
func blockedRing(t *testing.T, ns *netnstest.NS, cfg Config) (*Ring, *net.UDPConn) {
	t.Helper()
	var r *Ring
	var peer *net.UDPConn
	err := ns.Do(func() error {
		var err error
		if peer, err = net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)}); err != nil {
			return err
		}
		cfg.Bind, cfg.Shards, cfg.Owned = loopback4, 1, 1
		cfg.Handler = func(*Socket, []byte, netipAddrPort) {}
		r, err = New(cfg)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close(); peer.Close() })
	var serr error
	if err := r.shards[0].cur.rc.Control(func(fd uintptr) {
		serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_SNDBUF, 0) // the kernel's minimum
	}); err != nil || serr != nil {
		t.Fatalf("SO_SNDBUF: %v %v", err, serr)
	}
	return r, peer
}

// TestOwnedFullSendBufferKeepsDatagrams: an owned socket whose send
// buffer keeps filling up (a slow link, a minimal SO_SNDBUF): FlushOwned
// reports the full buffer instead of refusing datagrams, and the owner's
// later flushes send every datagram exactly once, in order.
func TestOwnedFullSendBufferKeepsDatagrams(t *testing.T) {
	for _, tc := range []struct {
		name  string
		noGSO bool
	}{{"segmented", false}, {"one by one", true}} {
		t.Run(tc.name, func(t *testing.T) {
			ns := slowLoopback(t, "2mbit")
			r, peer := blockedRing(t, ns, Config{DisableGSO: tc.noGSO})
			to := peer.LocalAddr().(*net.UDPAddr).AddrPort()
			const n, size = 400, 300
			got := make(chan []uint32, 1)
			go func() { // the peer: every datagram's sequence number
				var seqs []uint32
				buf := make([]byte, 2048)
				for len(seqs) < n {
					peer.SetReadDeadline(time.Now().Add(testkit.WaitBound))
					k, err := peer.Read(buf)
					if err != nil {
						break
					}
					seqs = append(seqs, binary.BigEndian.Uint32(buf[:k]))
				}
				got <- seqs
			}()
			sock := r.Hold(0)
			defer sock.Release()
			pkt := make([]byte, size)
			blockedTurns := 0
			for seq := 0; seq < n; { // owner turns: 40 datagrams, then the turn's flush
				for k := 0; k < 40 && seq < n; k++ {
					binary.BigEndian.PutUint32(pkt, uint32(seq))
					if err := r.Push(sock, to, pkt, uint64(seq)); err != nil {
						t.Fatalf("push %d: %v", seq, err)
					}
					seq++
				}
				if r.FlushOwned(0) {
					blockedTurns++
				}
			}
			testkit.WaitFor(t, "the queue sent", func() bool { return !r.FlushOwned(0) && r.shards[0].queued() == 0 })
			var seqs []uint32
			select {
			case seqs = <-got:
			case <-time.After(testkit.WaitBound):
				t.Fatal("the peer did not finish")
			}
			st := r.Stats()
			if st.SendBlocked == 0 || blockedTurns == 0 {
				t.Fatalf("no full send buffer met (blocked flushes %d): the test did not test it", st.SendBlocked)
			}
			if len(seqs) != n {
				t.Fatalf("peer got %d of %d datagrams (sent %d, stats %+v)", len(seqs), n, st.Sent, st.Dropped)
			}
			for i, s := range seqs {
				if s != uint32(i) {
					t.Fatalf("datagram %d carries %d: lost, duplicated or reordered", i, s)
				}
			}
			if st.Sent != n || st.Dropped != (DropCounts{}) {
				t.Fatalf("sent %d, drops %+v; want %d, none", st.Sent, st.Dropped, n)
			}
			t.Logf("%d flushes met a full buffer, %d datagrams kept for a later one", st.SendBlocked, st.Requeued)
		})
	}
}

// TestOwnedBlockedSocketBounded: a socket that stays blocked (the link
// passes nothing after its first burst): the queue holds at most
// QueueLen datagrams, further pushes are refused and counted, and every
// datagram is accounted for (sent, still queued, refused; at Close the
// queued ones count as closed).
func TestOwnedBlockedSocketBounded(t *testing.T) {
	ns := slowLoopback(t, "8bit")
	const qlen = 32
	r, peer := blockedRing(t, ns, Config{QueueLen: qlen})
	to := peer.LocalAddr().(*net.UDPAddr).AddrPort()
	sock := r.Hold(0)
	pkt := make([]byte, 300)
	var pushed, refused int
	for range 20 { // owner turns
		for range 16 {
			pushed++
			switch err := r.Push(sock, to, pkt, 0); {
			case errors.Is(err, ErrQueueFull):
				refused++
			case err != nil:
				t.Fatal(err)
			}
		}
		r.FlushOwned(0)
		if q := r.shards[0].queued(); q > qlen {
			t.Fatalf("%d datagrams queued, bound %d", q, qlen)
		}
	}
	sock.Release()
	if !r.FlushOwned(0) {
		t.Fatal("the blocked socket's flush did not report the full buffer")
	}
	st := r.Stats()
	queued := r.shards[0].queued()
	if refused == 0 || st.Dropped.QueueFull != uint64(refused) {
		t.Fatalf("refused pushes %d, counted %d; want some, all counted", refused, st.Dropped.QueueFull)
	}
	if got := int(st.Sent) + queued + refused; got != pushed || st.Dropped.SendError != 0 {
		t.Fatalf("sent %d + queued %d + refused %d = %d of %d pushed (send errors %d)",
			st.Sent, queued, refused, got, pushed, st.Dropped.SendError)
	}
	r.Close()
	if st := r.Stats(); st.Dropped.Closed != uint64(queued) {
		t.Fatalf("closed with %d queued, counted %d", queued, st.Dropped.Closed)
	}
}
