package rlserver

import (
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rl-tproxy/rl-tproxy/pkg/ratelimitly/wire"
)

// startDriven starts a loop-driven server with one socket.
func startDriven(t *testing.T, clk *fakeClock, batch int) (*Server, *Socket) {
	t.Helper()
	s := startServer(t, clk, func(cfg *Config) { cfg.Workers, cfg.Driven, cfg.Batch = 1, true, batch })
	if len(s.Sockets()) != 1 {
		t.Fatalf("%d sockets", len(s.Sockets()))
	}
	return s, s.Sockets()[0]
}

// sendN sends n requests with ids from..from+n-1 (loopback delivery is
// synchronous: they are queued when it returns).
func (c *tclient) sendN(from uint64, n int) {
	c.t.Helper()
	r := oneRes(res("b", 1_000_000, 1000, 1_000_000, 1))
	for i := 0; i < n; i++ {
		h := c.header(from + uint64(i))
		c.send(c.seal(&h, r))
	}
}

// recvIDs reads n answers and returns their ids.
func (c *tclient) recvIDs(n int) map[uint64]bool {
	c.t.Helper()
	seen := map[uint64]bool{}
	for i := 0; i < n; i++ {
		h, _, _ := c.recv()
		seen[h.RequestID] = true
	}
	return seen
}

// Datagrams sent before the owner attaches wait in the socket; Serve
// answers them, at most maxTurns batches per call, and says when it
// stopped at the bound.
func TestDrivenServeBounded(t *testing.T) {
	clk := newClock()
	s, k := startDriven(t, clk, 4)
	c := newClient(t, s, clk, testCred("acme", 1, 1))
	c.sendN(100, 10)
	if err := k.Attach(); err != nil {
		t.Fatal(err)
	}
	if err := k.Attach(); !errors.Is(err, ErrAttached) {
		t.Fatalf("second Attach: %v", err)
	}
	steps := []struct {
		turns     int
		more      bool
		responses uint64
	}{
		{1, true, 4},   // one full batch, stopped at the bound
		{1, true, 8},   // another
		{5, false, 10}, // a short read: empty
		{5, false, 10}, // nothing queued: EAGAIN
	}
	for i, st := range steps {
		if got := k.Serve(st.turns); got != st.more {
			t.Fatalf("step %d: more = %v, want %v", i, got, st.more)
		}
		if got := s.Stats().Responses; got != st.responses {
			t.Fatalf("step %d: %d responses, want %d", i, got, st.responses)
		}
	}
	if seen := c.recvIDs(10); len(seen) != 10 {
		t.Fatalf("%d distinct answers", len(seen))
	}
	k.Detach()
	if st := s.Stats(); st.Received != 10 || st.ReadErrors != 0 || st.SendErrors != 0 {
		t.Fatalf("stats %+v", st)
	}
}

// Close answers what is queued whatever the owner does: a socket never
// attached is drained by Close; an attached one stays open (its owner may
// still poll it) and Detach drains and closes it.
func TestDrivenCloseDrains(t *testing.T) {
	for _, attached := range []bool{false, true} {
		clk := newClock()
		s, k := startDriven(t, clk, 0)
		c := newClient(t, s, clk, testCred("acme", 1, 1))
		if attached {
			if err := k.Attach(); err != nil {
				t.Fatal(err)
			}
		}
		c.sendN(1, 50)
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		if attached {
			if got := s.Stats().Responses; got != 0 {
				t.Fatalf("attached: Close answered %d for the owner", got)
			}
			c.sendN(1000, 5)
			k.Serve(1) // the owner's last turn before it detaches
			k.Detach()
		}
		want := 50
		if attached {
			want = 55
		}
		if seen := c.recvIDs(want); len(seen) != want {
			t.Fatalf("attached=%v: %d distinct answers, want %d", attached, len(seen), want)
		}
		if k.Serve(1) {
			t.Fatal("Serve on a closed socket")
		}
		if err := k.Attach(); !errors.Is(err, ErrClosed) {
			t.Fatalf("Attach after Close: %v", err)
		}
	}
}

// A driven socket refuses nothing the worker refuses and answers nothing
// it would not: garbage, forged and oversized datagrams are dropped and
// counted, a replay gets the cached answer.
func TestDrivenDropsAbuse(t *testing.T) {
	clk := newClock()
	s, k := startDriven(t, clk, 0)
	if err := k.Attach(); err != nil {
		t.Fatal(err)
	}
	defer k.Detach()
	c := newClient(t, s, clk, testCred("acme", 1, 1))
	forger := newClient(t, s, clk, testCred("acme", 1, 99)) // right key id, wrong secret
	h := c.header(7)
	good := c.seal(&h, oneRes(res("b", 10, 1000, 10, 1)))
	fh := forger.header(8)
	c.send([]byte("garbage"))
	c.send(forger.seal(&fh, oneRes(res("b", 10, 1000, 10, 1))))
	c.send(make([]byte, wire.MaxDatagram+1))
	c.send(good)
	c.send(good) // replay
	k.Serve(1)
	h1, _, b1 := c.recv()
	h2, _, b2 := c.recv()
	if h1.RequestID != 7 || h2.RequestID != 7 || string(b1) != string(b2) {
		t.Fatalf("answers %d %d, same body %v", h1.RequestID, h2.RequestID, string(b1) == string(b2))
	}
	st := s.Stats()
	if st.Drops["magic"]+st.Drops["truncated"] != 1 || st.Drops["auth"] != 1 || st.Drops["too_large"] != 1 || st.Replays != 1 {
		t.Fatalf("drops %v replays %d", st.Drops, st.Replays)
	}
}

// An owner that detaches before Close hands the socket back: a worker
// goroutine serves it (clients off the loops keep their answers) until
// Close, which stops it (TestMain checks that no goroutine is left).
func TestDrivenDetachHandsToWorker(t *testing.T) {
	clk := newClock()
	s, k := startDriven(t, clk, 0)
	c := newClient(t, s, clk, testCred("acme", 1, 1))
	if err := k.Attach(); err != nil {
		t.Fatal(err)
	}
	c.sendN(1, 3)
	k.Detach() // three requests queued: the worker answers them
	if seen := c.recvIDs(3); len(seen) != 3 {
		t.Fatalf("%d distinct answers", len(seen))
	}
	check(t, "worker", c.do(oneRes(res("w", 1, 1000, 1, 1))), want{true, 0, 0, 0})
	if k.Serve(1) {
		t.Fatal("Serve after Detach")
	}
	if err := k.Attach(); !errors.Is(err, ErrAttached) {
		t.Fatalf("Attach of a worker's socket: %v", err)
	}
	c.sendN(100, 10)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if seen := c.recvIDs(10); len(seen) != 10 {
		t.Fatalf("%d distinct answers after Close", len(seen))
	}
}

// A read turn reads the clock once for all its datagrams, and every one
// of them is decided and answered at that time.
func TestTurnReadsClockOnce(t *testing.T) {
	clk := newClock()
	var reads atomic.Int64
	s := startServer(t, clk, func(cfg *Config) {
		cfg.Workers, cfg.Driven, cfg.Batch = 1, true, 8
		cfg.Now = func() time.Time { reads.Add(1); return clk.Now() }
	})
	k := s.Sockets()[0]
	c := newClient(t, s, clk, testCred("acme", 1, 1))
	c.sendN(1, 7) // less than the batch: one turn reads them all
	if err := k.Attach(); err != nil {
		t.Fatal(err)
	}
	defer k.Detach()
	before := reads.Load()
	if k.Serve(1) {
		t.Fatal("more after one turn of 7")
	}
	if got := reads.Load() - before; got != 1 {
		t.Fatalf("%d clock reads for one turn of 7 datagrams, want 1", got)
	}
	if got := len(c.recvIDs(7)); got != 7 || s.Stats().Allows != 7 {
		t.Fatalf("%d answers, %d allows", got, s.Stats().Allows)
	}
}
