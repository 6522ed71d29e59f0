package rlserver

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/rl-tproxy/rl-tproxy/pkg/ratelimitly/credentials"

	"github.com/rl-tproxy/rl-tproxy/pkg/ratelimitly/wire"
)

// handleFixture drives worker.handle in-process (no sockets) with fresh
// sealed requests.
type handleFixture struct {
	w   *worker
	key *wire.Key
	req *wire.RateRequest
	pkt []byte
	out []byte
	clk *fakeClock
	id  uint64
}

func newHandleFixture(t testing.TB) *handleFixture {
	clk := newClock()
	s := startServer(t, clk, func(cfg *Config) { cfg.Workers = 1; cfg.DedupCapacity = nShards * 4 })
	cred := testCred("acme", 1, 1)
	k, _ := wire.NewKey(cred.KeyID, cred.Secret)
	return &handleFixture{
		w:   newWorker(s, 99, nil), // own scratch; the running workers are idle
		key: k,
		req: &wire.RateRequest{Label: []byte("api"), Guards: []wire.Guard{{Service: []byte("checkout"), ThresholdMs: 100}},
			Resources: []wire.Resource{res("client:10.0.0.1", 1e9, 1000, 0, 1), res("global", 1e9, 1000, 0, 1)}},
		pkt: make([]byte, 0, wire.MaxDatagram),
		out: make([]byte, 0, wire.MaxDatagram),
		clk: clk,
	}
}

func (f *handleFixture) one(tb testing.TB, b wire.Body, id uint64) int {
	h := wire.Header{TTLms: 60, RequestID: id, Timestamp: uint64(f.clk.Now().UnixMilli())}
	p, err := f.key.Seal(f.pkt[:0], &h, b)
	if err != nil {
		tb.Fatal(err)
	}
	return f.w.handle(p, false, f.out)
}

func (f *handleFixture) request(tb testing.TB) {
	f.id++
	if f.one(tb, f.req, f.id) == 0 {
		tb.Fatal("no answer")
	}
}

// BenchmarkHandle: one decision (open, decide 2 resources + 1 guard, seal)
// without sockets.
func BenchmarkHandle(b *testing.B) {
	f := newHandleFixture(b)
	b.ReportAllocs()
	for b.Loop() {
		f.request(b)
	}
}

// BenchmarkLoopback measures decisions per second over loopback UDP with
// batching (recvmmsg/sendmmsg of up to 64 on both sides) and without (one
// datagram per syscall on both sides). Each of 4 client sockets keeps a
// window of 64 requests in flight.
func BenchmarkLoopback(b *testing.B) {
	for _, batch := range []int{64, 1} {
		b.Run(fmt.Sprintf("batch=%d", batch), func(b *testing.B) { benchLoopback(b, batch) })
	}
}

func benchLoopback(b *testing.B, batch int) {
	const clients, window = 4, 64
	clk := &realClock{}
	s, err := Start(Config{Listen: "127.0.0.1:0", Credentials: []credentialT{testCred("acme", 1, 1)}, Now: clk.Now, Batch: batch,
		DedupCapacity: 8192}) // small ring: wraps early, so the run shows steady state
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	cred := testCred("acme", 1, 1)
	key, _ := wire.NewKey(cred.KeyID, cred.Secret)
	var answered, lost atomic.Int64
	var next atomic.Int64
	total := int64(b.N)
	b.ResetTimer()
	start := time.Now()
	cpu0 := cpuTime()
	var wg sync.WaitGroup
	for c := 0; c < clients; c++ {
		conn, err := listenReusePort(netip.MustParseAddrPort("127.0.0.1:0"))
		if err != nil {
			b.Fatal(err)
		}
		defer conn.Close()
		bc, err := newBatchConn(conn)
		if err != nil {
			b.Fatal(err)
		}
		dst := sockaddr4(s.Addr())
		wg.Add(1)
		go func(c int) {
			defer wg.Done()
			req := oneRes(res(fmt.Sprintf("bucket-%d", c), 1e9, 1000, 0, 1))
			id := uint64(c) << 40
			for {
				w := int(min(window, total-next.Add(window)+window))
				if w <= 0 {
					return
				}
				for k := 0; k < w; k++ {
					id++
					h := wire.Header{TTLms: 60, RequestID: id, Timestamp: uint64(time.Now().UnixMilli())}
					p, err := key.Seal(bc.sbufs[k][:0], &h, req)
					if err != nil {
						b.Error(err)
						return
					}
					bc.siovs[k].Base = &bc.sbufs[k][0]
					bc.siovs[k].SetLen(len(p))
					bc.shdrs[k].Hdr.Name = (*byte)(unsafe.Pointer(dst))
					bc.shdrs[k].Hdr.Namelen = unix.SizeofSockaddrInet4
				}
				if batch > 1 {
					_, _ = bc.send(w)
				} else {
					for k := 0; k < w; k++ {
						_, _ = bc.sendRange(k, k+1)
					}
				}
				_ = conn.SetReadDeadline(time.Now().Add(time.Second))
				for got := 0; got < w; {
					n, err := bc.recv(min(batch, w-got))
					if errors.Is(err, os.ErrDeadlineExceeded) {
						lost.Add(int64(w - got))
						break
					}
					if err != nil {
						b.Error(err)
						return
					}
					got += n
					answered.Add(int64(n))
				}
			}
		}(c)
	}
	wg.Wait()
	el := time.Since(start)
	cpu := cpuTime() - cpu0
	b.StopTimer()
	if n := answered.Load(); n > 0 {
		b.ReportMetric(float64(cpu.Nanoseconds())/1e3/float64(n), "cpu-µs/decision")
	}
	b.ReportMetric(float64(answered.Load())/el.Seconds(), "decisions/s")
	b.ReportMetric(float64(lost.Load()), "lost")
	st := s.Stats()
	b.ReportMetric(float64(st.Steered), "steered")
	if st.ReadBatches > 0 {
		b.ReportMetric(float64(st.Received)/float64(st.ReadBatches), "dgrams/read")
	}
}

type credentialT = credentials.Credential

// cpuTime is the process's user+system CPU time: on a shared machine it
// shows the cost of a decision better than wall time does.
func cpuTime() time.Duration {
	var ru unix.Rusage
	if unix.Getrusage(unix.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

type realClock struct{}

func (realClock) Now() time.Time { return time.Now() }

func sockaddr4(ap netip.AddrPort) *unix.RawSockaddrInet4 {
	sa := &unix.RawSockaddrInet4{Family: unix.AF_INET, Addr: ap.Addr().As4()}
	p := (*[2]byte)(unsafe.Pointer(&sa.Port))
	p[0], p[1] = byte(ap.Port()>>8), byte(ap.Port())
	return sa
}
