package udpshard

import (
	"encoding/binary"
	"net/netip"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rl-tproxy/rl-tproxy/internal/testkit"
)

// TestFlushAsyncFromHandlerSentAtTurnEnd: datagrams queued by the handler
// (as a check started or ended by an answer does) are sent by the reader
// at the end of its read turn, with no wake-up of the shard loop.
func TestFlushAsyncFromHandlerSentAtTurnEnd(t *testing.T) {
	srv, _ := echoServer(t)
	const hops = 200
	var r *Ring
	done := make(chan uint64, 1)
	var pushErr atomic.Value
	r = newTestRing(t, 1, func(_ *Socket, pkt []byte, _ netip.AddrPort) {
		v := binary.BigEndian.Uint64(pkt)
		if v == hops {
			done <- v
			return
		}
		var b [8]byte
		binary.BigEndian.PutUint64(b[:], v+1)
		if err := r.PushCurrent(0, srv, b[:], 0); err != nil {
			pushErr.Store(err)
			return
		}
		r.FlushAsync(0)
	})
	var b [8]byte
	if err := r.SendCurrent(0, srv, b[:], 0); err != nil {
		t.Fatal(err)
	}
	if v := recvOne(t, done); v != hops {
		t.Fatalf("chain ended at %d", v)
	}
	if err := pushErr.Load(); err != nil {
		t.Fatalf("push from the handler: %v", err)
	}
	st := r.Stats()
	if st.TurnFlushHits != hops || st.FlushWakes != 0 {
		t.Errorf("%d hops: %d FlushAsync calls left to the reader, %d loop wake-ups; want %d and 0",
			hops, st.TurnFlushHits, st.FlushWakes, hops)
	}
	if st.TurnFlushes < hops || st.Sent != hops+1 {
		t.Errorf("turn flushes %d, sent %d; want >= %d and %d", st.TurnFlushes, st.Sent, hops, hops+1)
	}
}

// TestFlushAsyncNeverStrandsDatagrams: goroutines ping-pong one datagram
// at a time with FlushAsync while the readers deliver the others' echoes,
// so many calls find a reader delivering and leave the send to it. Each
// goroutine waits for its own echo before sending again: a datagram left
// in the queue with nobody to send it would stall the test.
func TestFlushAsyncNeverStrandsDatagrams(t *testing.T) {
	srv, _ := echoServer(t)
	const workers, rounds = 8, 300
	echo := make([]chan struct{}, workers)
	for i := range echo {
		echo[i] = make(chan struct{}, 1)
	}
	r := newTestRing(t, 2, func(_ *Socket, pkt []byte, _ netip.AddrPort) {
		echo[binary.BigEndian.Uint64(pkt)] <- struct{}{}
		runtime.Gosched() // let the worker just woken queue and flush while we deliver
	})
	var wg sync.WaitGroup
	errs := make(chan string, workers)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var b [8]byte
			binary.BigEndian.PutUint64(b[:], uint64(w))
			for range rounds {
				if err := r.PushCurrent(w%2, srv, b[:], 0); err != nil {
					errs <- err.Error()
					return
				}
				r.FlushAsync(w % 2)
				select {
				case <-echo[w]:
				case <-time.After(10 * time.Second):
					errs <- "no echo for a datagram: it stayed queued"
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Fatal(e)
	}
	// The counters are added after a turn's delivery: wait for them.
	testkit.WaitFor(t, "counters", func() bool { return r.Stats().Received == workers*rounds })
	st := r.Stats()
	if st.Sent != workers*rounds {
		t.Fatalf("sent %d, want %d", st.Sent, workers*rounds)
	}
	t.Logf("FlushAsync calls left to a delivering reader: %d of %d", st.TurnFlushHits, workers*rounds)
}
