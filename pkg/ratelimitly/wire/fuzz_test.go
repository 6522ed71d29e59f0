package wire

import (
	"bytes"
	"testing"

	"github.com/rl-tproxy/rl-tproxy/internal/fuzzcorpus"
)

// Every decoder: never panics; what decodes re-encodes to the same bytes
// (the encoding is canonical).

func fuzzBody(f *testing.F, seeds [][]byte, mk func() Body) {
	for _, s := range seeds {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		b := mk()
		if err := b.DecodeBody(in); err != nil {
			return
		}
		out, err := b.AppendBody(nil)
		if err != nil {
			t.Fatalf("decoded body does not re-encode: %v", err)
		}
		if !bytes.Equal(out, in) {
			t.Fatalf("re-encoding differs:\n in %x\nout %x", in, out)
		}
	})
}

func seedBodies() map[string][][]byte {
	req := sampleRequest()
	rb, _ := req.AppendBody(nil)
	minReq, _ := (&RateRequest{Guards: []Guard{{Service: []byte("s"), ThresholdMs: 1}}}).AppendBody(nil)
	resp, _ := (&RateResponse{Success: true, ServerEpoch: 1767225000000, Guards: []GuardResult{{Passed: true, ObservedMs: 3}}, Resources: []ResourceResult{{Remaining: 4}, {TokensDeficit: 1, RetryAfterMs: 10}}}).AppendBody(nil)
	deny, _ := (&RateResponse{Status: StatusMalformed}).AppendBody(nil)
	rep, _ := (&LatencyReport{Entries: []ReportEntry{{Service: []byte("checkout"), DurationMs: 12}}}).AppendBody(nil)
	rep2, _ := (&LatencyReport{Entries: []ReportEntry{{Service: []byte("a"), DurationMs: 1}, {Service: []byte("b"), DurationMs: 1 << 31}}}).AppendBody(nil)
	comp, _ := (&Completion{Decision: DecisionAllow, Request: *req}).AppendBody(nil)
	comp2, _ := (&Completion{Decision: DecisionDeny, Request: RateRequest{Guards: []Guard{{Service: []byte("g"), ThresholdMs: 5}}}}).AppendBody(nil)
	return map[string][][]byte{
		"FuzzRateRequest":   {rb, minReq, {0, 0, 0, 0}, {1}},
		"FuzzRateResponse":  {resp, deny, {0, 1}},
		"FuzzLatencyReport": {rep, rep2, {0}},
		"FuzzCompletion":    {comp, comp2, {3}},
	}
}

func seedDatagrams() [][]byte {
	k := testKey(nil, 7, 1)
	var out [][]byte
	for _, b := range []Body{sampleRequest(), &RateResponse{Success: true}, &LatencyReport{Entries: []ReportEntry{{Service: []byte("s"), DurationMs: 2}}}, &Completion{Decision: DecisionAllow, Request: *sampleRequest()}} {
		h := sampleHeader()
		p, _ := k.SealNonce(nil, &h, b)
		out = append(out, p)
	}
	return out
}

func FuzzRateRequest(f *testing.F) {
	fuzzBody(f, seedBodies()["FuzzRateRequest"], func() Body { return &RateRequest{} })
}

func FuzzRateResponse(f *testing.F) {
	fuzzBody(f, seedBodies()["FuzzRateResponse"], func() Body { return &RateResponse{} })
}

func FuzzLatencyReport(f *testing.F) {
	fuzzBody(f, seedBodies()["FuzzLatencyReport"], func() Body { return &LatencyReport{} })
}

func FuzzCompletion(f *testing.F) {
	fuzzBody(f, seedBodies()["FuzzCompletion"], func() Body { return &Completion{} })
}

// FuzzHeader: header decoding never panics and round-trips.
func FuzzHeader(f *testing.F) {
	for _, s := range seedDatagrams() {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		var h Header
		if err := h.Decode(in); err != nil {
			return
		}
		out := make([]byte, HeaderLen)
		h.Put(out)
		if !bytes.Equal(out, in[:HeaderLen]) {
			t.Fatalf("header re-encoding differs")
		}
	})
}

// FuzzOpen: opening arbitrary datagrams never panics; anything that opens
// with the test key decodes through the kind dispatcher without panicking.
func FuzzOpen(f *testing.F) {
	for _, s := range seedDatagrams() {
		f.Add(s)
	}
	k := testKey(nil, 7, 1)
	f.Fuzz(func(t *testing.T, in []byte) {
		var h Header
		pt, err := k.Open(bytes.Clone(in), &h)
		if err != nil {
			return
		}
		var (
			req  RateRequest
			resp RateResponse
			rep  LatencyReport
			comp Completion
		)
		_ = DecodeBody(h.Kind, pt, &req, &resp, &rep, &comp)
	})
}

// TestSeedCorpus checks that testdata/fuzz holds the generated seeds
// (RL_WRITE_CORPUS=1 rewrites it).
func TestSeedCorpus(t *testing.T) {
	all := seedBodies()
	all["FuzzHeader"] = seedDatagrams()
	all["FuzzOpen"] = seedDatagrams()
	for name, seeds := range all {
		fuzzcorpus.Sync(t, name, seeds)
	}
}
