package admission

import (
	"encoding/binary"
	"testing"

	"github.com/rl-tproxy/rl-tproxy/pkg/ratelimitly"
	"github.com/rl-tproxy/rl-tproxy/pkg/ratelimitly/wire"
)

// FuzzClassify: any response shape is classified without panicking, and an
// allow verdict only ever comes with the whole allow contract satisfied.
func FuzzClassify(f *testing.F) {
	f.Add(uint8(0), true, uint8(1), uint8(1), []byte{1, 0, 0, 0, 0})
	f.Add(uint8(0), false, uint8(0), uint8(2), []byte{0, 0, 0, 0, 1, 0, 0, 0, 0})
	f.Add(uint8(2), true, uint8(1), uint8(0), []byte{1})
	f.Fuzz(func(t *testing.T, status uint8, success bool, nGuards, nRes uint8, data []byte) {
		var resp wire.RateResponse
		resp.Status, resp.Success = status, success
		i := 0
		next := func() byte {
			if i >= len(data) {
				return 0
			}
			i++
			return data[i-1]
		}
		for g := next(); g > 0 && len(resp.Guards) < 40; g-- {
			resp.Guards = append(resp.Guards, wire.GuardResult{Passed: next()&1 == 1})
		}
		for r := next(); r > 0 && len(resp.Resources) < 40; r-- {
			var b [4]byte
			b[3] = next()
			resp.Resources = append(resp.Resources, wire.ResourceResult{TokensDeficit: binary.BigEndian.Uint32(b[:])})
		}
		v, c := Classify(&resp, int(nGuards%40), int(nRes%40))
		if v == VerdictAllow {
			if status != wire.StatusOK || !success || len(resp.Guards) != int(nGuards%40) || len(resp.Resources) != int(nRes%40) {
				t.Fatalf("allow without the contract: %+v", resp)
			}
			for _, g := range resp.Guards {
				if !g.Passed {
					t.Fatal("allow with a failed guard")
				}
			}
			for _, r := range resp.Resources {
				if r.TokensDeficit != 0 {
					t.Fatal("allow with a deficit")
				}
			}
		}
		if c == ratelimitly.CauseCardinality && v != VerdictNone {
			t.Fatal("cardinality mismatch with a verdict")
		}
	})
}
