package udpshard

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/rl-tproxy/rl-tproxy/internal/testkit"
)

// echoServer echoes every datagram back to its sender on loopback.
func echoServer(t *testing.T) (netip.AddrPort, *net.UDPConn) {
	t.Helper()
	c, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatalf("listen: %v", err)
	}
	t.Cleanup(func() { c.Close() })
	go func() {
		buf := make([]byte, 4096)
		for {
			n, from, err := c.ReadFromUDPAddrPort(buf)
			if err != nil {
				return
			}
			if _, err := c.WriteToUDPAddrPort(buf[:n], from); err != nil {
				return
			}
		}
	}()
	return c.LocalAddr().(*net.UDPAddr).AddrPort(), c
}

func recvOne(t *testing.T, ch <-chan uint64) uint64 {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(10 * time.Second):
		t.Fatal("timed out waiting for a datagram")
		return 0
	}
}

func newTestRing(t *testing.T, shards int, h Handler) *Ring {
	t.Helper()
	r, err := New(Config{Bind: netip.MustParseAddr("127.0.0.1"), Shards: shards, Handler: h, RebindBackoffMin: time.Millisecond, RebindBackoffMax: 4 * time.Millisecond})
	if err != nil {
		t.Fatalf("new ring: %v", err)
	}
	t.Cleanup(func() { r.Close() })
	return r
}

func TestSendReceiveAcrossShards(t *testing.T) {
	srv, _ := echoServer(t)
	got := make(chan uint64, 1024)
	var shardsSeen [4]atomic.Uint64
	r := newTestRing(t, 4, func(sock *Socket, pkt []byte, from netip.AddrPort) {
		shard := sock.Shard()
		if from != srv {
			t.Errorf("datagram from %v, want %v", from, srv)
		}
		shardsSeen[shard].Add(1)
		got <- binary.BigEndian.Uint64(pkt)
	})
	// Waves of 40 keep the echo server's socket buffer from overflowing.
	const n = 400
	seen := make(map[uint64]bool)
	for w := 0; w < n; w += 40 {
		for i := w; i < w+40; i++ {
			var b [8]byte
			binary.BigEndian.PutUint64(b[:], uint64(i))
			if err := r.SendCurrent(i%4, srv, b[:], 0); err != nil {
				t.Fatalf("send %d: %v", i, err)
			}
		}
		for len(seen) < w+40 {
			seen[recvOne(t, got)] = true
		}
	}
	for i := range shardsSeen {
		if shardsSeen[i].Load() == 0 {
			t.Errorf("shard %d received nothing", i)
		}
	}
	// Received counts a batch once its handler calls are done: the last
	// batch's datagrams can reach the handler (and this test) first.
	var st Stats
	testkit.WaitFor(t, fmt.Sprintf("%d datagrams counted received", n), func() bool { st = r.Stats(); return st.Received >= n })
	if st.Sent != n || st.Received != n {
		t.Errorf("stats sent=%d received=%d, want %d", st.Sent, st.Received, n)
	}
	if st.SendBatches == 0 || st.SendBatches > st.Sent || st.RecvBatches == 0 || st.RecvBatches > st.Received {
		t.Errorf("batch counters inconsistent: %+v", st)
	}
	if st.Sockets != 4 {
		t.Errorf("sockets = %d, want 4", st.Sockets)
	}
}

func TestSendRejects(t *testing.T) {
	r := newTestRing(t, 1, func(*Socket, []byte, netip.AddrPort) {})
	if err := r.SendCurrent(0, netip.MustParseAddrPort("[::1]:9"), []byte("x"), 0); !errors.Is(err, ErrFamily) {
		t.Errorf("v6 dest from v4 socket: err = %v, want ErrFamily", err)
	}
	if err := r.SendCurrent(0, netip.MustParseAddrPort("127.0.0.1:9"), make([]byte, MaxPayload+1), 0); !errors.Is(err, ErrTooLarge) {
		t.Errorf("oversize: err = %v, want ErrTooLarge", err)
	}
	if err := r.SendCurrent(0, netip.AddrPort{}, []byte("x"), 0); !errors.Is(err, ErrFamily) {
		t.Errorf("zero dest: err = %v, want ErrFamily", err)
	}
	st := r.Stats()
	if st.Dropped.Family != 2 || st.Dropped.TooLarge != 1 {
		t.Errorf("drops = %+v", st.Dropped)
	}
	r.Close()
	if err := r.SendCurrent(0, netip.MustParseAddrPort("127.0.0.1:9"), []byte("x"), 0); !errors.Is(err, ErrClosed) {
		t.Errorf("after close: err = %v, want ErrClosed", err)
	}
}

func TestSendErrorCallback(t *testing.T) {
	var tokens []uint64
	errc := make(chan uint64, 4)
	r, err := New(Config{Bind: netip.MustParseAddr("127.0.0.1"), Shards: 1, Handler: func(*Socket, []byte, netip.AddrPort) {},
		OnSendError: func(tok uint64, err error) { errc <- tok }})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	// A socket bound to 127.0.0.1 cannot send to a non-loopback destination
	// (no route or EINVAL): the kernel refuses it.
	if err := r.SendCurrent(0, netip.MustParseAddrPort("192.0.2.1:9"), []byte("x"), 77); err != nil {
		t.Fatalf("enqueue: %v", err)
	}
	tokens = append(tokens, recvOne(t, errc))
	if tokens[0] != 77 {
		t.Errorf("token = %d, want 77", tokens[0])
	}
	if st := r.Stats(); st.Dropped.SendError != 1 || st.Sent != 0 {
		t.Errorf("stats = %+v", st)
	}
}

// TestTruncatedDropped: without UDP_GRO a buffer holds recvBufSize bytes
// and a larger datagram is dropped (with it, buffers hold any datagram).
func TestTruncatedDropped(t *testing.T) {
	got := make(chan uint64, 4)
	r, err := New(Config{Bind: netip.MustParseAddr("127.0.0.1"), Shards: 1, DisableGRO: true,
		Handler: func(_ *Socket, pkt []byte, _ netip.AddrPort) { got <- uint64(len(pkt)) }})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	c, err := net.DialUDP("udp4", nil, net.UDPAddrFromAddrPort(r.LocalAddr(0)))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Write(make([]byte, recvBufSize+100)); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Write([]byte("ok")); err != nil {
		t.Fatal(err)
	}
	if n := recvOne(t, got); n != 2 {
		t.Fatalf("first delivered datagram has %d bytes, want the 2-byte one", n)
	}
	// The counters are added after the turn's delivery: wait for them.
	testkit.WaitFor(t, "counters", func() bool { return r.Stats().Received == 1 })
	if st := r.Stats(); st.Dropped.Truncated != 1 || st.Received != 1 {
		t.Errorf("stats = %+v", st)
	}
}

func TestRebindTransactional(t *testing.T) {
	srv, _ := echoServer(t)
	got := make(chan uint64, 16)
	r := newTestRing(t, 1, func(_ *Socket, pkt []byte, _ netip.AddrPort) { got <- binary.BigEndian.Uint64(pkt) })
	held := r.Hold(0)
	before := held.LocalAddr()
	r.Rebind(held)
	r.Rebind(held) // a duplicate request while pending is absorbed
	testkit.WaitFor(t, "rebind", func() bool { return r.Stats().Rebinds == 1 })
	after := r.LocalAddr(0)
	if after == before {
		t.Fatalf("local address unchanged after rebind: %v", after)
	}
	// The held (old) socket stays open and usable for its request.
	if st := r.Stats(); st.Sockets != 2 || st.Retired != 0 {
		t.Fatalf("after switch: %+v", st)
	}
	if err := r.Send(held, srv, []byte{0, 0, 0, 0, 0, 0, 0, 1}, 0); err != nil {
		t.Fatal(err)
	}
	if v := recvOne(t, got); v != 1 {
		t.Fatalf("echo on old socket = %d", v)
	}
	// Steering about the replaced socket is ignored.
	r.Rebind(held)
	held.Release()
	testkit.WaitFor(t, "retire", func() bool { return r.Stats().Retired == 1 })
	st := r.Stats()
	if st.Sockets != 1 || st.Rebinds != 1 {
		t.Fatalf("after retire: %+v", st)
	}
	if err := r.SendCurrent(0, srv, []byte{0, 0, 0, 0, 0, 0, 0, 2}, 0); err != nil {
		t.Fatal(err)
	}
	if v := recvOne(t, got); v != 2 {
		t.Fatalf("echo on new socket = %d", v)
	}
}

func TestRebindFailureKeepsWorkingSocket(t *testing.T) {
	srv, _ := echoServer(t)
	got := make(chan uint64, 16)
	r := newTestRing(t, 1, func(_ *Socket, pkt []byte, _ netip.AddrPort) { got <- binary.BigEndian.Uint64(pkt) })
	var fails atomic.Int32
	fails.Store(3)
	failed := make(chan struct{}, 8)
	r.openHook = func(int) error {
		if fails.Add(-1) >= 0 {
			failed <- struct{}{}
			return errors.New("injected open failure")
		}
		return nil
	}
	before := r.LocalAddr(0)
	sock := r.Hold(0)
	r.Rebind(sock)
	sock.Release()
	<-failed
	// The working socket still sends and receives during the failures.
	if err := r.SendCurrent(0, srv, []byte{0, 0, 0, 0, 0, 0, 0, 9}, 0); err != nil {
		t.Fatal(err)
	}
	if v := recvOne(t, got); v != 9 {
		t.Fatalf("echo = %d", v)
	}
	testkit.WaitFor(t, "rebind after retries", func() bool { return r.Stats().Rebinds == 1 })
	st := r.Stats()
	if st.RebindFailures != 3 {
		t.Errorf("rebind failures = %d, want 3", st.RebindFailures)
	}
	if r.LocalAddr(0) == before {
		t.Error("address unchanged after successful retry")
	}
	testkit.WaitFor(t, "retire", func() bool { return r.Stats().Retired == 1 })
}

func TestRebindFromHandler(t *testing.T) {
	srv, _ := echoServer(t)
	got := make(chan uint64, 16)
	var r *Ring
	r = newTestRing(t, 1, func(sock *Socket, pkt []byte, _ netip.AddrPort) {
		if bytes.Equal(pkt, []byte("steer")) {
			r.Rebind(sock) // on the read path: must only schedule
		}
		got <- uint64(len(pkt))
	})
	if err := r.SendCurrent(0, srv, []byte("steer"), 0); err != nil {
		t.Fatal(err)
	}
	recvOne(t, got)
	testkit.WaitFor(t, "rebind+retire", func() bool { st := r.Stats(); return st.Rebinds == 1 && st.Retired == 1 })
	if err := r.SendCurrent(0, srv, []byte("abc"), 0); err != nil {
		t.Fatal(err)
	}
	if n := recvOne(t, got); n != 3 {
		t.Fatalf("got %d", n)
	}
}

func TestCloseLeavesNoGoroutines(t *testing.T) {
	base := runtime.NumGoroutine()
	for i := 0; i < 5; i++ {
		r, err := New(Config{Bind: netip.MustParseAddr("127.0.0.1"), Shards: 3, Handler: func(*Socket, []byte, netip.AddrPort) {}})
		if err != nil {
			t.Fatal(err)
		}
		s := r.Hold(1)
		r.Rebind(s)
		r.Close()
		r.Close()
		s.Release()
	}
	testkit.WaitFor(t, "goroutines to exit", func() bool { return runtime.NumGoroutine() <= base })
}

func TestNewRequiresHandler(t *testing.T) {
	if _, err := New(Config{}); err == nil {
		t.Fatal("New without handler succeeded")
	}
	if _, err := New(Config{Bind: netip.MustParseAddr("192.0.2.77"), Handler: func(*Socket, []byte, netip.AddrPort) {}}); err == nil {
		t.Fatal("bind to a non-local address succeeded")
	}
}

func TestDualStackAnyBind(t *testing.T) {
	srv, _ := echoServer(t)
	got := make(chan uint64, 4)
	r, err := New(Config{Shards: 1, Handler: func(_ *Socket, pkt []byte, from netip.AddrPort) {
		if !from.Addr().Is4() {
			t.Errorf("source %v not unmapped to IPv4", from)
		}
		got <- uint64(len(pkt))
	}})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	la := r.LocalAddr(0)
	if !la.Addr().IsUnspecified() {
		t.Fatalf("local address %v, want unspecified", la)
	}
	if la.Addr().Is4() {
		testkit.Missing(t, "needs IPv6: the dual-stack socket fell back to IPv4")
	}
	if err := r.SendCurrent(0, srv, []byte("hello"), 0); err != nil {
		t.Fatalf("v4 destination from a dual-stack socket: %v", err)
	}
	if n := recvOne(t, got); n != 5 {
		t.Fatalf("got %d bytes", n)
	}
}

func TestFlushAsyncSendsQueueInOneBatch(t *testing.T) {
	srv, _ := echoServer(t)
	got := make(chan uint64, 2*MaxBatch)
	r := newTestRing(t, 1, func(_ *Socket, pkt []byte, _ netip.AddrPort) { got <- binary.BigEndian.Uint64(pkt) })
	push := func(from, to int) {
		for i := from; i < to; i++ {
			var b [8]byte
			binary.BigEndian.PutUint64(b[:], uint64(i))
			if err := r.PushCurrent(0, srv, b[:], 0); err != nil {
				t.Fatalf("push %d: %v", i, err)
			}
		}
	}
	recvAll := func(from, to int) {
		seen := make(map[uint64]bool)
		for len(seen) < to-from {
			v := recvOne(t, got)
			if v < uint64(from) || v >= uint64(to) {
				t.Fatalf("unexpected datagram %d", v)
			}
			seen[v] = true
		}
	}
	// Below MaxBatch: the loop sends the whole queue in one sendmmsg.
	push(0, 40)
	r.FlushAsync(0)
	recvAll(0, 40)
	testkit.WaitFor(t, "send counters", func() bool { st := r.Stats(); return st.Sent == 40 && st.SendBatches > 0 })
	if st := r.Stats(); st.SendBatches != 1 || st.FlushWakes != 1 {
		t.Fatalf("after 40 datagrams and one FlushAsync: %+v, want 1 batch, 1 flush wake", st)
	}
	// A full batch is sent by the caller itself, before FlushAsync returns.
	push(40, 40+MaxBatch)
	r.FlushAsync(0)
	if st := r.Stats(); st.Sent != 40+MaxBatch || st.SendBatches != 2 || st.FlushWakes != 1 {
		t.Fatalf("after a full queue: %+v, want %d sent inline in a second batch", st, 40+MaxBatch)
	}
	recvAll(40, 40+MaxBatch)
	// FlushAsync on an empty queue is harmless. The reader may still be
	// in the read turn whose last answer recvAll took (its handler fed
	// got): then the flush is left to that turn's end and no wake-up is
	// due; otherwise the loop wakes once.
	hits := r.Stats().TurnFlushHits
	r.FlushAsync(0)
	testkit.WaitFor(t, "the empty flush taken by the loop or left to the reader's turn", func() bool {
		st := r.Stats()
		return st.FlushWakes+st.TurnFlushHits-hits == 2
	})
	if st := r.Stats(); st.Sent != 40+MaxBatch || st.SendBatches != 2 || st.Dropped != (DropCounts{}) {
		t.Fatalf("after an empty flush: %+v", st)
	}
}

// runGSOCase queues datagrams (an 8-byte id, then padding to size) and checks
// that each arrives once, whole, at the right server.
type gsoDgram struct {
	to   int // index of the echo server
	size int
}

func runGSOCase(t *testing.T, cfg Config, prep func(r *Ring), dgrams []gsoDgram) Stats {
	t.Helper()
	srvs := []netip.AddrPort{}
	for range 2 {
		a, _ := echoServer(t)
		srvs = append(srvs, a)
	}
	type rx struct {
		id   uint64
		size int
		from netip.AddrPort
		ok   bool // padding intact
	}
	got := make(chan rx, len(dgrams))
	cfg.Bind = netip.MustParseAddr("127.0.0.1")
	cfg.Shards = 1
	cfg.Handler = func(_ *Socket, pkt []byte, from netip.AddrPort) {
		id := binary.BigEndian.Uint64(pkt)
		ok := true
		for k := 8; k < len(pkt); k++ {
			ok = ok && pkt[k] == byte(int(id)+k)
		}
		got <- rx{id, len(pkt), from, ok}
	}
	r, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if prep != nil {
		prep(r)
	}
	buf := make([]byte, MaxPayload)
	for i, d := range dgrams {
		binary.BigEndian.PutUint64(buf, uint64(i))
		for k := 8; k < d.size; k++ {
			buf[k] = byte(i + k)
		}
		if err := r.PushCurrent(0, srvs[d.to], buf[:d.size], uint64(i)); err != nil {
			t.Fatalf("push %d: %v", i, err)
		}
	}
	r.Flush(0) // the whole queue in one flush, on this goroutine
	seen := make(map[uint64]bool)
	for len(seen) < len(dgrams) {
		v := <-got
		if v.id >= uint64(len(dgrams)) || seen[v.id] {
			t.Fatalf("unexpected or duplicate datagram %d", v.id)
		}
		d := dgrams[v.id]
		if v.size != d.size || v.from != srvs[d.to] || !v.ok {
			t.Fatalf("datagram %d: %d bytes from %v (content ok %v), want %d bytes from %v", v.id, v.size, v.from, v.ok, d.size, srvs[d.to])
		}
		seen[v.id] = true
	}
	return r.Stats()
}

func TestGSOGroupsDatagramsPerDestination(t *testing.T) {
	var ds []gsoDgram
	for range 10 { // interleaved destinations, same size
		ds = append(ds, gsoDgram{0, 100}, gsoDgram{1, 100})
	}
	ds = append(ds, gsoDgram{0, 50}) // a short last segment closes A's message
	ds = append(ds, gsoDgram{0, 100}, gsoDgram{0, 8}, gsoDgram{1, 1300})
	st := runGSOCase(t, Config{}, nil, ds)
	if st.Sent != uint64(len(ds)) || st.Dropped != (DropCounts{}) {
		t.Fatalf("stats %+v, want %d sent", st, len(ds))
	}
	if st.GSOFallbacks != 0 {
		testkit.Missing(t, "needs UDP segmentation (UDP_SEGMENT) on loopback; the kernel refused it (fallback worked): %+v", st)
	}
	// A: 10x100 + 50 in one message, then 100+8 in a second; B: 10x100;
	// B's 1300-byte datagram is over gsoMaxSegSize and goes alone.
	if st.GSOSegments != 11+2+10 || st.SendBatches != 1 {
		t.Fatalf("gso segments %d, batches %d, want 23 in 1 sendmmsg: %+v", st.GSOSegments, st.SendBatches, st)
	}
}

func TestGSORefusedFallsBack(t *testing.T) {
	// The kernel refuses UDP_SEGMENT (EINVAL) on a socket with SO_NO_CHECK.
	noCheck := func(r *Ring) {
		sock := r.shards[0].cur
		var serr error
		if err := sock.rc.Control(func(fd uintptr) {
			serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_NO_CHECK, 1)
		}); err != nil || serr != nil {
			testkit.Missing(t, "needs SO_NO_CHECK on a UDP socket: %v %v", err, serr)
		}
	}
	var ds []gsoDgram
	for range 12 {
		ds = append(ds, gsoDgram{0, 200}, gsoDgram{1, 120})
	}
	st := runGSOCase(t, Config{}, noCheck, ds)
	if st.Sent != uint64(len(ds)) || st.Dropped != (DropCounts{}) || st.GSOSegments != 0 || st.GSOFallbacks != 1 {
		t.Fatalf("stats %+v, want all %d sent one by one after 1 fallback", st, len(ds))
	}
}

func TestGSODisabled(t *testing.T) {
	var ds []gsoDgram
	for range 10 {
		ds = append(ds, gsoDgram{0, 64})
	}
	st := runGSOCase(t, Config{DisableGSO: true}, nil, ds)
	if st.Sent != 10 || st.GSOSegments != 0 || st.GSOFallbacks != 0 || st.SendBatches != 1 {
		t.Fatalf("stats %+v, want 10 datagrams in 1 sendmmsg without segmentation", st)
	}
}

// TestDrainDeliversWhileReaderHeldBack: Drain hands the datagrams queued
// in the kernel to the handler on the calling goroutine while the
// socket's reader goroutine cannot run (held back by ReadGate), more than
// one read turn's worth included.
func TestDrainDeliversWhileReaderHeldBack(t *testing.T) {
	gate := make(chan struct{})
	var gated atomic.Int64
	var got atomic.Int64
	r, err := New(Config{Bind: netip.MustParseAddr("127.0.0.1"), Shards: 1,
		Handler:  func(*Socket, []byte, netip.AddrPort) { got.Add(1) },
		ReadGate: func(*Socket) { gated.Add(1); <-gate }})
	if err != nil {
		t.Fatalf("new ring: %v", err)
	}
	t.Cleanup(func() { r.Close() })
	t.Cleanup(func() { close(gate) }) // before Close: the reader must exit
	conn, err := net.DialUDP("udp4", nil, net.UDPAddrFromAddrPort(r.LocalAddr(0)))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	const n = 3*MaxBatch + 5
	for i := range n {
		if _, err := conn.Write([]byte{byte(i)}); err != nil {
			t.Fatalf("write %d: %v", i, err)
		}
	}
	// Loopback delivers into the receive queue as it sends; a bounded
	// number of Drain calls covers one that went to a softirq thread.
	for i := 0; i < 10000 && got.Load() < n; i++ {
		r.Drain(0)
	}
	if got.Load() != n {
		t.Fatalf("drained %d datagrams, want %d", got.Load(), n)
	}
	if st := r.Stats(); st.Received != n || st.RecvBatches < 4 {
		t.Errorf("stats received %d batches %d, want %d in >= 4 turns", st.Received, st.RecvBatches, n)
	}
	if g := gated.Load(); g > 1 {
		t.Errorf("reader reached its gate %d times, want at most once (held back)", g)
	}
}

// TestPortNotShareable: a ring socket's port is its own. Linux gives a
// port-0 SO_REUSEPORT bind a port already held by SO_REUSEPORT sockets
// of the same user, and would then split incoming datagrams between
// them; a ring socket must therefore refuse to join a reuseport group,
// whoever binds later (another process's server or client).
func TestPortNotShareable(t *testing.T) {
	r := newTestRing(t, 1, func(*Socket, []byte, netip.AddrPort) {})
	local := r.LocalAddr(0)
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_REUSEPORT, 1); err != nil {
		t.Fatal(err)
	}
	err = unix.Bind(fd, &unix.SockaddrInet4{Addr: local.Addr().As4(), Port: int(local.Port())})
	if !errors.Is(err, unix.EADDRINUSE) {
		t.Fatalf("SO_REUSEPORT bind to the ring's port %s: %v, want EADDRINUSE", local, err)
	}
}
