package rlserver

import (
	"bytes"
	"testing"

	"github.com/rl-tproxy/rl-tproxy/internal/fuzzcorpus"

	"github.com/rl-tproxy/rl-tproxy/pkg/ratelimitly/wire"
)

// FuzzHandle feeds the server's datagram handler (header, key lookup,
// open, timestamp, body decode, decision, answer) with (a) the raw input as
// a datagram and (b) the input as a plaintext body of the kind named by its
// first byte, sealed with a valid key and a current timestamp, so the
// decision code sees arbitrary authenticated bodies. It must never panic,
// and an answer must always be a valid sealed RATE_RESPONSE.
func FuzzHandle(f *testing.F) {
	for _, s := range handleSeeds() {
		f.Add(s)
	}
	fx := newHandleFixture(f)
	f.Fuzz(func(t *testing.T, in []byte) {
		fx.w.handle(bytes.Clone(in), false, fx.out)
		if len(in) == 0 || len(in) > wire.MaxBody {
			return
		}
		fx.id++
		h := wire.Header{Kind: wire.Kind(in[0]%4 + 1), TTLms: 60, RequestID: fx.id, Timestamp: uint64(fx.clk.Now().UnixMilli())}
		p, err := fx.key.SealBody(fx.pkt[:0], &h, in[1:])
		if err != nil {
			return
		}
		n := fx.w.handle(p, false, fx.out)
		if n == 0 {
			return
		}
		var rh wire.Header
		var resp wire.RateResponse
		if err := fx.key.OpenBody(fx.out[:n], &rh, &resp); err != nil {
			t.Fatalf("answer does not open: %v", err)
		}
		if rh.RequestID != fx.id {
			t.Fatalf("answer for id %d, want %d", rh.RequestID, fx.id)
		}
	})
}

func handleSeeds() [][]byte {
	req := &wire.RateRequest{Label: []byte("api"), Guards: []wire.Guard{{Service: []byte("checkout"), ThresholdMs: 100}},
		Resources: []wire.Resource{{Bucket: []byte("b"), Rate: 5, PeriodMs: 1000, Burst: 5, Cost: 1}}}
	rb, _ := req.AppendBody(nil)
	rep, _ := (&wire.LatencyReport{Entries: []wire.ReportEntry{{Service: []byte("checkout"), DurationMs: 30}}}).AppendBody(nil)
	comp, _ := (&wire.Completion{Decision: wire.DecisionAllow, Request: *req}).AppendBody(nil)
	dup, _ := (&wire.RateRequest{Resources: []wire.Resource{{Bucket: []byte("d"), Rate: 1, PeriodMs: 1, Cost: 9}, {Bucket: []byte("d"), Rate: 4294967295, PeriodMs: 4294967295, Burst: 4294967295, Cost: 4294967295}}}).AppendBody(nil)
	// first byte selects the kind: k%4+1
	return [][]byte{
		append([]byte{0}, rb...),
		append([]byte{2}, rep...),
		append([]byte{3}, comp...),
		append([]byte{0}, dup...),
		{1, 0, 1},
		[]byte("RL\x01\x01garbage"),
	}
}

// TestHandleCorpus checks that testdata/fuzz/FuzzHandle holds the
// generated seeds (RL_WRITE_CORPUS=1 rewrites it).
func TestHandleCorpus(t *testing.T) {
	fuzzcorpus.Sync(t, "FuzzHandle", handleSeeds())
}
