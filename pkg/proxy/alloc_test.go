//go:build !race

// Allocation tests (testing.AllocsPerRun). Their counts are meaningless
// under -race (the detector allocates, sync.Pool drops items), so this file
// is left out of the race run and `make test-alloc` runs it without -race.
// Every test here has "Alloc" in its name: that pass selects them by it.

package proxy

import (
	"bytes"
	"net"
	"testing"

	"github.com/rl-tproxy/rl-tproxy/pkg/exchange"
)

// asyncAllowHook decides every request inside Begin.
type asyncAllowHook struct{ allowHook }

func (asyncAllowHook) Begin(_ *exchange.Request, d *exchange.Decision, _ Resumer) bool {
	*d = exchange.Decision{Allow: true}
	return true
}
func (asyncAllowHook) Cancel(*exchange.Request) {}

// asyncLaterHook resumes every request from another goroutine.
type asyncLaterHook struct {
	allowHook
	ch chan Resumer
}

func (h asyncLaterHook) Begin(_ *exchange.Request, d *exchange.Decision, res Resumer) bool {
	*d = exchange.Decision{Allow: true}
	h.ch <- res
	return false
}
func (asyncLaterHook) Cancel(*exchange.Request) {}

// TestAllocsLoopPath pins the data path at zero allocations per
// proxied keep-alive GET in steady state: without a Hook, with a blocking
// Hook (Admit on a worker goroutine), with an AsyncHook deciding in Begin
// and with one resuming from another goroutine; and for 1 MiB bodies,
// whose write queue grows into larger pooled buffers (14 allocations per
// response before the queue took them from the loop's size classes).
func TestAllocsLoopPath(t *testing.T) {
	if testing.Short() {
		t.Skip("short")
	}
	later := asyncLaterHook{ch: make(chan Resumer, 1)}
	done := make(chan struct{})
	defer close(done)
	go func() {
		for {
			select {
			case r := <-later.ch:
				r.Resume()
			case <-done:
				return
			}
		}
	}()
	for _, tc := range []struct {
		name string
		hook exchange.Hook
		resp []byte
	}{
		{"no-hook", nil, fixedResponse},
		{"blocking-hook", allowHook{}, fixedResponse},
		{"async-hook-at-once", asyncAllowHook{}, fixedResponse},
		{"async-hook-resumed", later, fixedResponse},
		// 1 MiB bodies: the write queue reuses the loop's buffers
		{"1MiB-body", nil, bigResponse},
	} {
		t.Run(tc.name, func(t *testing.T) {
			up := fastUpstream(t, tc.resp)
			_, addr := startProxy(t, tc.hook, &exchange.Service{Name: "a", Upstream: up, XForwardedFor: true},
				func(cfg *Config) { cfg.EventLoops = 1 })
			bc := newBenchClient(t, addr)
			for i := 0; i < 100; i++ { // warm the free lists
				if err := bc.roundTrip(); err != nil {
					t.Fatal(err)
				}
			}
			allocs := testing.AllocsPerRun(500, func() {
				if err := bc.roundTrip(); err != nil {
					t.Fatal(err)
				}
			})
			t.Logf("allocs per proxied request: %.2f", allocs)
			if allocs > 0 {
				t.Fatalf("allocs per proxied request %.2f > 0", allocs)
			}
		})
	}
}

// TestAllocsLoopPathUpload: 1 MiB request bodies, spliced to the
// upstream, cost no allocation per request in steady state either.
func TestAllocsLoopPathUpload(t *testing.T) {
	if testing.Short() {
		t.Skip("short")
	}
	up := sinkUpstream(t, 1<<20)
	p, addr := startProxy(t, nil, &exchange.Service{Name: "a", Upstream: up}, func(cfg *Config) { cfg.EventLoops = 1 })
	bc := newBenchClientReq(t, addr, append([]byte("POST /up HTTP/1.1\r\nHost: bench\r\nContent-Length: 1048576\r\n\r\n"),
		spliceBody(1<<20, 8)...))
	for i := 0; i < 50; i++ { // warm the free lists
		if err := bc.roundTrip(); err != nil {
			t.Fatal(err)
		}
	}
	before := p.Stats().Loops.Spliced
	allocs := testing.AllocsPerRun(100, func() {
		if err := bc.roundTrip(); err != nil {
			t.Fatal(err)
		}
	})
	t.Logf("allocs per proxied 1 MiB upload: %.2f", allocs)
	if spliced := p.Stats().Loops.Spliced - before; spliced < 100*(512<<10) {
		t.Fatalf("%d bytes spliced in 101 uploads: the path under test is not the splice", spliced)
	}
	if allocs > 0 {
		t.Fatalf("allocs per proxied upload %.2f > 0", allocs)
	}
}

// sinkUpstream reads requests with a body of exactly n bytes and answers
// each with fixedResponse, allocating nothing per request (the process's
// allocations are what AllocsPerRun counts).
func sinkUpstream(t *testing.T, n int) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				buf := make([]byte, 64<<10)
				have := 0
				for {
					i := bytes.Index(buf[:have], []byte("\r\n\r\n"))
					if i < 0 {
						k, err := c.Read(buf[have:])
						if err != nil {
							return
						}
						have += k
						continue
					}
					body := have - (i + 4) // body bytes already read
					if body > n {
						return // not what the test sends
					}
					for left := n - body; left > 0; {
						k, err := c.Read(buf[:min(left, len(buf))])
						if err != nil {
							return
						}
						left -= k
					}
					have = 0
					if _, err := c.Write(fixedResponse); err != nil {
						return
					}
				}
			}()
		}
	}()
	return ln.Addr().String()
}

// CheckPath allocates nothing, with or without escapes in the path.
func TestCheckPathAlloc(t *testing.T) {
	svc := &exchange.Service{DecodeEscapedSlashes: true}
	for _, p := range []string{"/api/v1/items", "/api/%61x", "/api%2Fx", "/a%2F../b"} {
		b := []byte(p)
		if n := testing.AllocsPerRun(100, func() { exchange.CheckPath(svc, b) }); n != 0 {
			t.Errorf("%q: %v allocations", p, n)
		}
	}
}
