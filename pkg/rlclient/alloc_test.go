//go:build !race

// Allocation tests (testing.AllocsPerRun). Their counts are meaningless
// under -race (the detector allocates, sync.Pool drops items), so this file
// is left out of the race run and `make test-alloc` runs it without -race.
// Every test here has "Alloc" in its name: that pass selects them by it.

package rlclient

import (
	"context"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/rl-tproxy/rl-tproxy/internal/dnstest"
	"github.com/rl-tproxy/rl-tproxy/pkg/ratelimitly/wire"
)

// startQuietNode is an allocation-free responder (allow, epoch 1) used
// to measure the client's own allocations: AllocsPerRun counts the whole
// process, so the peer must not allocate either.
func startQuietNode(t testing.TB) netip.AddrPort {
	t.Helper()
	conn, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	cred := testCred()
	key, _ := wire.NewKey(cred.KeyID, cred.Secret)
	done := make(chan struct{})
	go func() {
		defer close(done)
		buf := make([]byte, 2048)
		out := make([]byte, 0, wire.MaxDatagram)
		var h wire.Header
		var req wire.RateRequest
		resp := wire.RateResponse{ServerEpoch: 1, Success: true,
			Guards: make([]wire.GuardResult, 0, wire.MaxCount), Resources: make([]wire.ResourceResult, 0, wire.MaxCount)}
		for {
			n, from, err := conn.ReadFromUDPAddrPort(buf)
			if err != nil {
				return
			}
			if key.OpenBody(buf[:n], &h, &req) != nil {
				continue
			}
			resp.Guards = resp.Guards[:len(req.Guards)]
			for i := range resp.Guards {
				resp.Guards[i] = wire.GuardResult{Passed: true, ObservedMs: 1}
			}
			resp.Resources = resp.Resources[:len(req.Resources)]
			for i := range resp.Resources {
				resp.Resources[i] = wire.ResourceResult{Remaining: 9}
			}
			rh := wire.Header{Flags: wire.FlagSteering | h.Flags&wire.FlagReplay, Attempt: h.Attempt, TTLms: h.TTLms,
				RequestID: h.RequestID, Timestamp: uint64(time.Now().UnixMilli())}
			pkt, err := key.Seal(out[:0], &rh, &resp)
			if err == nil {
				conn.WriteToUDPAddrPort(pkt, from)
			}
		}
	}()
	t.Cleanup(func() { conn.Close(); <-done })
	return conn.LocalAddr().(*net.UDPAddr).AddrPort()
}

func TestCheckZeroAllocsSteadyState(t *testing.T) {
	d := dnstest.Start(t)
	d.SetSRV(testSRV, targetsFor(startQuietNode(t), startQuietNode(t), startQuietNode(t))...)
	c := newTestClient(t, d.Addr(), clientOpts{shards: 1})
	waitReady(t, c)
	req := testRequest()
	var dec Decision
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	check := func() {
		if err := c.Check(ctx, req, &dec); err != nil {
			t.Fatalf("check: %v", err)
		}
	}
	for i := 0; i < 500; i++ {
		check()
	}
	if a := testing.AllocsPerRun(1000, check); a != 0 {
		t.Errorf("allocs per Check = %v, want 0", a)
	}
	svc := []byte("svc-a")
	report := func() { c.Report(svc, 5*time.Millisecond) }
	for i := 0; i < 100; i++ {
		report()
	}
	if a := testing.AllocsPerRun(200, report); a != 0 {
		t.Errorf("allocs per Report = %v, want 0", a)
	}
}
