package embedded

import (
	"runtime"
	"strings"
	"sync/atomic"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/rl-tproxy/rl-tproxy/internal/testkit"
	"github.com/rl-tproxy/rl-tproxy/pkg/evloop"
	"github.com/rl-tproxy/rl-tproxy/pkg/ratelimitly"
	"github.com/rl-tproxy/rl-tproxy/pkg/rlclient"
	"github.com/rl-tproxy/rl-tproxy/pkg/rlserver"
)

// A loop-driven server answers the real client through discovery with no
// worker goroutine; datagrams sent before the loops attach wait for them.
func TestLoopDrivenAnswersClient(t *testing.T) {
	eachBackend(t, func(t *testing.T, be evloop.Backend) {
		g := startLoops(t, be, 2)
		c := testCred(t)
		e := startLoopDriven(t, 2, c)
		buf := make([]byte, 1<<20)
		if st := string(buf[:runtime.Stack(buf, true)]); strings.Contains(st, "rlserver.(*worker).run") {
			t.Fatal("a loop-driven server runs worker goroutines")
		}
		p := newRawPeer(t, e, c)
		for id := uint64(1); id <= 5; id++ {
			p.send(p.seal(id))
		}
		ds := attach(t, g, e.LoopAttacher())
		for i := 0; i < 5; i++ {
			p.recv()
		}
		cl := newClient(t, e, c)
		got := []rlclient.Cause{check(t, cl, "b", 2), check(t, cl, "b", 2), check(t, cl, "b", 2)}
		if got[0] != rlclient.CauseAllow || got[1] != rlclient.CauseAllow || got[2] != ratelimitly.CauseDenyResource {
			t.Fatalf("causes %v, want allow allow deny (burst 2)", got)
		}
		// The client can read an answer before the loop that sent it
		// counted it: wait for the count, then check the rest.
		testkit.WaitFor(t, "the server counts its 8 responses", func() bool { return e.Server.Stats().Responses >= 8 })
		if st := e.Server.Stats(); st.Allows != 7 || st.Denies != 1 || st.Responses != 8 {
			t.Fatalf("allows %d denies %d responses %d", st.Allows, st.Denies, st.Responses)
		}
		detach(t, g, ds)
	})
}

// Garbage, forged, oversized and replayed datagrams get what the worker
// gives them (nothing, nothing, nothing, the cached answer), and the loop
// keeps answering the real client.
func TestLoopDrivenAbuse(t *testing.T) {
	eachBackend(t, func(t *testing.T, be evloop.Backend) {
		g := startLoops(t, be, 1)
		c := testCred(t)
		e := startLoopDriven(t, 1, c)
		ds := attach(t, g, e.LoopAttacher())
		defer detach(t, g, ds)
		forged := c
		forged.Secret[0] ^= 1
		p, f := newRawPeer(t, e, c), newRawPeer(t, e, forged)
		good := p.seal(42)
		for _, b := range [][]byte{[]byte("garbage"), f.seal(43), make([]byte, 1500), good, good} {
			p.send(b)
		}
		if a, b := p.recv(), p.recv(); a != 42 || b != 42 {
			t.Fatalf("answers %d %d, want the request and its replay", a, b)
		}
		if check(t, newClient(t, e, c), "after", 1) != rlclient.CauseAllow {
			t.Fatal("client not answered after the abuse")
		}
		st := e.Server.Stats()
		if st.Drops["truncated"] != 1 || st.Drops["auth"] != 1 || st.Drops["too_large"] != 1 || st.Replays != 1 {
			t.Fatalf("drops %v replays %d", st.Drops, st.Replays)
		}
	})
}

// A flood is served ServeTurns batches per wake-up: another socket of the
// loop becomes readable in the middle of it and is served before the
// flood is through.
func TestLoopDrivenFloodBounded(t *testing.T) {
	eachBackend(t, func(t *testing.T, be evloop.Backend) {
		g := startLoops(t, be, 1)
		l := g.Loops()[0]
		c := testCred(t)
		e := startLoopDriven(t, 1, c)
		efd, err := unix.Eventfd(0, unix.EFD_NONBLOCK|unix.EFD_CLOEXEC)
		if err != nil {
			t.Fatal(err)
		}
		defer unix.Close(efd)
		var seenMid atomic.Uint64 // datagrams the server had read when the other fd was served
		var w *evloop.Watch
		on(t, l, func() {
			w, err = l.Watch(efd, func() {
				var b [8]byte
				if n, _ := unix.Read(efd, b[:]); n == 8 && seenMid.Load() == 0 {
					seenMid.Store(e.Server.Stats().Received)
				}
			})
		})
		if err != nil {
			t.Fatal(err)
		}
		defer on(t, l, func() { w.Stop() })
		p := newRawPeer(t, e, c)
		const flood = 3 * ServeTurns * rlserver.MaxBatch
		junk := make([]byte, 64)
		for i := 0; i < flood; i++ {
			p.send(junk)
		}
		p.send(p.seal(1)) // the probe: answered after the flood (one socket, in order)
		var ds []func()
		on(t, l, func() {
			d, err := e.LoopAttacher().AttachLoop(l)
			if err != nil {
				t.Error(err)
			}
			ds = append(ds, d)
			_, _ = unix.Write(efd, []byte{1, 0, 0, 0, 0, 0, 0, 0})
		})
		defer detach(t, g, ds)
		if id := p.recv(); id != 1 {
			t.Fatalf("answer %d", id)
		}
		total := e.Server.Stats().Received
		if total <= ServeTurns*rlserver.MaxBatch {
			testkit.Missing(t, "the socket queued only %d datagrams (net.core.rmem_max too small for the flood)", total)
		}
		if mid := seenMid.Load(); mid == 0 || mid >= total {
			t.Fatalf("the other fd was served after %d of %d datagrams, want in the middle", mid, total)
		}
	})
}

// Detaching or closing with datagrams queued answers them (the server
// drains the socket when it closes it) and leaves no descriptor behind;
// goroutines are checked by TestMain.
func TestLoopDrivenCloseQueued(t *testing.T) {
	eachBackend(t, func(t *testing.T, be evloop.Backend) {
		for _, tc := range []struct {
			name        string
			detachFirst bool // the loops detach (proxy shutdown) before Close
		}{{"detach-then-close", true}, {"close-while-attached", false}} {
			t.Run(tc.name, func(t *testing.T) {
				before := testkit.CountFDs(t)
				g := startLoops(t, be, 1)
				l := g.Loops()[0]
				c := testCred(t)
				e := startLoopDriven(t, 1, c)
				p := newRawPeer(t, e, c)
				ds := attach(t, g, e.LoopAttacher())
				on(t, l, func() {
					for id := uint64(1); id <= 20; id++ {
						p.send(p.seal(id)) // queued: the loop is busy running this
					}
					if tc.detachFirst {
						ds[0]()
					}
				})
				if err := e.Close(); err != nil {
					t.Fatal(err)
				}
				seen := map[uint64]bool{}
				for i := 0; i < 20; i++ {
					seen[p.recv()] = true
				}
				if len(seen) != 20 {
					t.Fatalf("%d distinct answers", len(seen))
				}
				detach(t, g, ds) // the proxy's shutdown: already done, idempotent
				if err := g.Close(); err != nil {
					t.Fatal(err)
				}
				p.conn.Close()
				testkit.WaitFor(t, "descriptors back to the baseline", func() bool { return testkit.CountFDs(t) <= before })
			})
		}
	})
}
