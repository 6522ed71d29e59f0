package udpshard

import (
	"bytes"
	"net"
	"net/netip"
	"runtime"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/rl-tproxy/rl-tproxy/internal/testkit"
)

// testOwner is an Owner for tests: one goroutine with an edge-triggered
// epoll set (as an event loop's) that runs watch callbacks, posted
// functions and, at the end of each turn, turnEnd.
type testOwner struct {
	ep, ev  int
	mu      sync.Mutex
	posted  []func()
	watches map[int]func() // owner goroutine only
	turnEnd func()         // owner goroutine only
	gid     uint64
	done    chan struct{}
	stopped bool // owner goroutine only
}

func newTestOwner(t *testing.T) *testOwner {
	t.Helper()
	ep, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	ev, err := unix.Eventfd(0, unix.EFD_NONBLOCK|unix.EFD_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	o := &testOwner{ep: ep, ev: ev, watches: map[int]func(){}, done: make(chan struct{})}
	if err := unix.EpollCtl(ep, unix.EPOLL_CTL_ADD, ev, &unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(ev)}); err != nil {
		t.Fatal(err)
	}
	started := make(chan struct{})
	go o.run(started)
	<-started
	t.Cleanup(o.close)
	return o
}

func (o *testOwner) run(started chan struct{}) {
	defer close(o.done)
	o.gid = testkit.GoroutineID()
	close(started)
	var evs [16]unix.EpollEvent
	for !o.stopped {
		n, err := unix.EpollWait(o.ep, evs[:], -1)
		if err == unix.EINTR {
			continue
		}
		for _, e := range evs[:max(n, 0)] {
			if int(e.Fd) == o.ev {
				var b [8]byte
				unix.Read(o.ev, b[:])
				o.mu.Lock()
				p := o.posted
				o.posted = nil
				o.mu.Unlock()
				for _, fn := range p {
					fn()
				}
			} else if fn := o.watches[int(e.Fd)]; fn != nil {
				fn()
			}
		}
		if o.turnEnd != nil {
			o.turnEnd()
		}
	}
}

func (o *testOwner) Watch(fd int, fn func()) (func(), error) {
	if err := unix.EpollCtl(o.ep, unix.EPOLL_CTL_ADD, fd, &unix.EpollEvent{Events: unix.EPOLLIN | unix.EPOLLET, Fd: int32(fd)}); err != nil {
		return nil, err
	}
	o.watches[fd] = fn
	return func() {
		unix.EpollCtl(o.ep, unix.EPOLL_CTL_DEL, fd, nil)
		delete(o.watches, fd)
	}, nil
}

func (o *testOwner) Post(fn func()) {
	o.mu.Lock()
	o.posted = append(o.posted, fn)
	o.mu.Unlock()
	var b [8]byte
	b[0] = 1
	unix.Write(o.ev, b[:])
}

// do runs fn on the owner goroutine and waits.
func (o *testOwner) do(t *testing.T, fn func()) {
	t.Helper()
	ch := make(chan struct{})
	o.Post(func() { fn(); close(ch) })
	select {
	case <-ch:
	case <-time.After(10 * time.Second):
		t.Fatal("owner did not run a posted function")
	}
}

func (o *testOwner) close() {
	o.Post(func() { o.stopped = true })
	<-o.done
	unix.Close(o.ep)
	unix.Close(o.ev)
}

// readerGoroutines counts the udpshard reader goroutines running now.
func readerGoroutines() int {
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	return bytes.Count(buf, []byte("udpshard.(*reader).run"))
}

type ownedRx struct {
	gid  uint64
	n    int
	from uint16 // local port of the socket that received
}

func newOwnedRing(t *testing.T, cfg Config, h Handler) *Ring {
	t.Helper()
	if cfg.Handler == nil {
		cfg.Handler = h
	}
	r, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	return r
}

// TestOwnedShardReadOnOwnerThread: an owned shard has no reader
// goroutine; its datagrams reach the owner's handler on the owner's
// goroutine, and what the owner queued goes out when it flushes.
func TestOwnedShardReadOnOwnerThread(t *testing.T) {
	peer, _ := echoServer(t)
	before := readerGoroutines()
	goroutineRx := make(chan ownedRx, 16)
	r := newOwnedRing(t, Config{Bind: loopback4, Shards: 2, Owned: 1}, func(s *Socket, p []byte, _ netipAddrPort) {
		goroutineRx <- ownedRx{gid: testkit.GoroutineID(), n: len(p), from: s.LocalAddr().Port()}
	})
	waitFor(t, "the goroutine shard's reader", func() bool { return readerGoroutines()-before >= 1 })
	if got := readerGoroutines() - before; got != 1 {
		t.Fatalf("%d reader goroutines for one goroutine shard and one owned shard, want 1", got)
	}
	o := newTestOwner(t)
	rx := make(chan ownedRx, 16)
	var release func()
	o.do(t, func() {
		var err error
		release, err = r.Own(0, o, func(s *Socket, p []byte, _ netipAddrPort) {
			rx <- ownedRx{gid: testkit.GoroutineID(), n: len(p), from: s.LocalAddr().Port()}
		})
		if err != nil {
			t.Error(err)
		}
		o.turnEnd = func() { r.FlushOwned(0) }
	})
	if _, err := r.Own(1, o, func(*Socket, []byte, netipAddrPort) {}); err == nil {
		t.Fatal("Own of a goroutine shard succeeded")
	}
	o.do(t, func() {
		for i := range 5 {
			if err := r.PushCurrent(0, peer, make([]byte, 10+i), 0); err != nil {
				t.Error(err)
			}
		}
	})
	for range 5 {
		select {
		case got := <-rx:
			if got.gid != o.gid {
				t.Fatalf("owned datagram handled on goroutine %d, owner is %d", got.gid, o.gid)
			}
		case <-goroutineRx:
			t.Fatal("owned datagram handled by the goroutine handler")
		case <-time.After(10 * time.Second):
			t.Fatal("no answer on the owned shard")
		}
	}
	waitFor(t, "the receive count", func() bool { return r.Stats().Received == 5 }) // counted after the handler
	st := r.Stats()
	if st.Sent != 5 || st.Received != 5 || st.SendBatches != 1 {
		t.Fatalf("sent %d received %d in %d batches, want 5, 5, 1", st.Sent, st.Received, st.SendBatches)
	}
	o.do(t, release)
}

// TestOwnedShardDrops: an oversized datagram is dropped as truncated, an
// empty one is delivered, and the socket keeps working.
func TestOwnedShardDrops(t *testing.T) {
	r := newOwnedRing(t, Config{Bind: loopback4, Shards: 1, Owned: 1, DisableGRO: true}, func(*Socket, []byte, netipAddrPort) {})
	o := newTestOwner(t)
	rx := make(chan int, 16)
	var release func()
	o.do(t, func() {
		release, _ = r.Own(0, o, func(_ *Socket, p []byte, _ netipAddrPort) { rx <- len(p) })
	})
	defer o.do(t, release)
	c := dialUDP(t, r.LocalAddr(0))
	for _, n := range []int{recvBufSize + 100, 0, 7} {
		if _, err := c.Write(make([]byte, n)); err != nil {
			t.Fatal(err)
		}
	}
	for _, want := range []int{0, 7} {
		select {
		case n := <-rx:
			if n != want {
				t.Fatalf("delivered %d bytes, want %d", n, want)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("datagram not delivered")
		}
	}
	if st := r.Stats(); st.Dropped.Truncated != 1 {
		t.Fatalf("truncated drops %d, want 1", st.Dropped.Truncated)
	}
}

// TestOwnedShardRebind: after a rebind the owner watches the new socket
// and still reads the old one (late answers) until it is released, then
// closes it on its thread.
func TestOwnedShardRebind(t *testing.T) {
	r := newOwnedRing(t, Config{Bind: loopback4, Shards: 1, Owned: 1, RebindMinInterval: -1}, func(*Socket, []byte, netipAddrPort) {})
	o := newTestOwner(t)
	rx := make(chan ownedRx, 16)
	var release func()
	o.do(t, func() {
		release, _ = r.Own(0, o, func(s *Socket, p []byte, _ netipAddrPort) {
			rx <- ownedRx{gid: testkit.GoroutineID(), n: len(p), from: s.LocalAddr().Port()}
		})
	})
	defer o.do(t, release)
	old := r.Hold(0)
	oldAddr := old.LocalAddr()
	r.Rebind(old)
	waitFor(t, "rebind", func() bool { return r.Stats().Rebinds == 1 })
	newAddr := r.LocalAddr(0)
	for _, to := range []netipAddrPort{oldAddr, newAddr} {
		c := dialUDP(t, to)
		waitFor(t, "delivery on "+to.String(), func() bool {
			c.Write([]byte("x"))
			select {
			case got := <-rx:
				if got.gid != o.gid {
					t.Fatalf("handled on goroutine %d, owner is %d", got.gid, o.gid)
				}
				return got.from == to.Port()
			case <-time.After(20 * time.Millisecond):
				return false
			}
		})
	}
	old.Release()
	waitFor(t, "retirement", func() bool { return r.Stats().Retired == 1 && r.Stats().Sockets == 1 })
}

// TestOwnedShardCloseBeforeRelease: Close with an owner leaves the
// watched sockets to the owner, which closes them at release; Drain
// from another goroutine uses the goroutine handler.
func TestOwnedShardCloseBeforeRelease(t *testing.T) {
	drained := make(chan uint64, 4)
	r := newOwnedRing(t, Config{Bind: loopback4, Shards: 1, Owned: 1}, func(*Socket, []byte, netipAddrPort) { drained <- testkit.GoroutineID() })
	c := dialUDP(t, r.LocalAddr(0))
	c.Write([]byte("before the owner"))
	waitFor(t, "drain", func() bool {
		r.Drain(0)
		return len(drained) == 1
	})
	o := newTestOwner(t)
	var release func()
	o.do(t, func() { release, _ = r.Own(0, o, func(*Socket, []byte, netipAddrPort) {}) })
	r.Close()
	o.do(t, release)
	o.do(t, release) // idempotent
}

type netipAddrPort = netip.AddrPort

var loopback4 = netip.MustParseAddr("127.0.0.1")

func dialUDP(t *testing.T, to netip.AddrPort) *net.UDPConn {
	t.Helper()
	c, err := net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(to))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// waitFor polls cond (bounded): for state another goroutine reaches.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestOwnedShardFloodGoesOnInLaterTurns: more datagrams than the read
// bound of one onReadable call are read in later owner turns (Post),
// all on the owner's goroutine.
func TestOwnedShardFloodGoesOnInLaterTurns(t *testing.T) {
	r := newOwnedRing(t, Config{Bind: loopback4, Shards: 1, Owned: 1, DisableGRO: true}, func(*Socket, []byte, netipAddrPort) {})
	const n = 3 * maxOwnedTurns * MaxBatch
	c := dialUDP(t, r.LocalAddr(0))
	for i := range n {
		if _, err := c.Write([]byte{byte(i)}); err != nil {
			t.Fatal(err)
		}
	}
	o := newTestOwner(t)
	var got, offOwner int // owner goroutine only until the wait below
	done := make(chan struct{})
	var release func()
	o.do(t, func() {
		release, _ = r.Own(0, o, func(*Socket, []byte, netipAddrPort) {
			if testkit.GoroutineID() != o.gid {
				offOwner++
			}
			if got++; got == n {
				close(done)
			}
		})
	})
	defer o.do(t, release)
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		var k int
		o.do(t, func() { k = got })
		t.Fatalf("%d of %d datagrams delivered", k, n)
	}
	o.do(t, func() {
		if offOwner != 0 {
			t.Errorf("%d datagrams handled off the owner's goroutine", offOwner)
		}
	})
	if st := r.Stats(); st.Received != n || st.Dropped.RecvError != 0 {
		t.Fatalf("received %d (want %d), recv errors %d", st.Received, n, st.Dropped.RecvError)
	}
}

// manualOwner is an Owner whose turns the test runs by hand.
type manualOwner struct {
	watch  func()
	posted []func()
}

func (o *manualOwner) Watch(_ int, fn func()) (func(), error) {
	o.watch = fn
	return func() { o.watch = nil }, nil
}

func (o *manualOwner) Post(fn func()) { o.posted = append(o.posted, fn) }

// TestOwnedFloodBoundedPerTurn: a socket with more queued than one read
// bound, while every owner turn also brings a readiness edge (a flood):
// each turn reads at most maxOwnedTurns batches and leaves at most one
// continuation: continuations must not pile up, one more per turn, nor
// the datagrams read per turn grow with them.
func TestOwnedFloodBoundedPerTurn(t *testing.T) {
	r := newOwnedRing(t, Config{Bind: loopback4, Shards: 1, Owned: 1, DisableGRO: true}, func(*Socket, []byte, netipAddrPort) {})
	const n = 6 * maxOwnedTurns * MaxBatch
	c := dialUDP(t, r.LocalAddr(0))
	for i := range n {
		if _, err := c.Write([]byte{byte(i)}); err != nil {
			t.Fatal(err)
		}
	}
	got := 0
	o := &manualOwner{}
	release, err := r.Own(0, o, func(*Socket, []byte, netipAddrPort) { got++ })
	if err != nil {
		t.Fatal(err)
	}
	defer release()
	if len(o.posted) != 1 {
		t.Fatalf("Own read a full bound and posted %d continuations, want 1", len(o.posted))
	}
	for turn := 1; turn <= 4; turn++ {
		before := got
		p := o.posted
		o.posted = nil
		for _, fn := range p {
			fn()
		}
		o.watch() // the flood's readiness edge of this turn
		if read := got - before; read > maxOwnedTurns*MaxBatch {
			t.Fatalf("turn %d read %d datagrams, bound %d", turn, read, maxOwnedTurns*MaxBatch)
		}
		if len(o.posted) > 1 {
			t.Fatalf("turn %d left %d continuations for one socket", turn, len(o.posted))
		}
	}
	if got == 0 {
		t.Fatal("nothing read")
	}
}

// TestOwnedGROFloodBoundedInDatagrams: with UDP_GRO, one message holds up
// to 64 datagrams, so the per-wake bound counts datagrams: a backlog of
// two reads' worth of coalesced messages (128 × 64 datagrams) is read one
// read at a time, the rest in a continuation (it was read whole: the
// bound counted read turns of messages).
func TestOwnedGROFloodBoundedInDatagrams(t *testing.T) {
	r := newOwnedRing(t, Config{Bind: loopback4, Shards: 1, Owned: 1}, func(*Socket, []byte, netipAddrPort) {})
	const msgs, segs, seg = 2 * MaxBatch, 64, 8
	for range msgs {
		sendSegmented(t, r.LocalAddr(0), segmentedPayload(segs-1, seg, seg), seg)
	}
	got := 0
	o := &manualOwner{}
	release, err := r.Own(0, o, func(*Socket, []byte, netipAddrPort) { got++ })
	if err != nil {
		t.Fatal(err)
	}
	defer release()
	if st := r.Stats(); st.GRODatagrams == 0 {
		testkit.Missing(t, "the kernel did not coalesce the segmented datagrams (UDP_GRO)")
	}
	if got > MaxBatch*segs || len(o.posted) != 1 {
		t.Fatalf("one wake-up read %d datagrams (bound %d, one read may bring %d) and posted %d continuations, want 1",
			got, maxOwnedTurns*MaxBatch, MaxBatch*segs, len(o.posted))
	}
	for len(o.posted) > 0 {
		p := o.posted
		o.posted = nil
		for _, fn := range p {
			fn()
		}
	}
	if got != msgs*segs {
		t.Fatalf("read %d datagrams in all, sent %d", got, msgs*segs)
	}
}
