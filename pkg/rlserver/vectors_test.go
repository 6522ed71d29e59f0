package rlserver

import (
	"bytes"
	"encoding/hex"
	"math"
	"testing"
	"time"

	"github.com/rl-tproxy/rl-tproxy/internal/protovec"
	"github.com/rl-tproxy/rl-tproxy/pkg/ratelimitly/credentials"
	"github.com/rl-tproxy/rl-tproxy/pkg/ratelimitly/wire"
)

// TestProtocolVectors replays the server conformance vectors of
// docs/protocol-vectors: each datagram, at its server time, must give
// exactly the expected answer (header fields and plaintext body), no
// answer, or a drop counted under the named reason; the buckets end as
// listed.
func TestProtocolVectors(t *testing.T) {
	vs, err := protovec.Load("../../docs/protocol-vectors")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, v := range vs {
		if v.Role != "server" {
			continue
		}
		n++
		t.Run(v.Name, func(t *testing.T) { replayServerVector(t, v) })
	}
	if n == 0 {
		t.Fatal("no server vectors")
	}
}

func replayServerVector(t *testing.T, v protovec.Vector) {
	clk := newClock()
	clk.ns.Store(int64(v.ServerStartMs) * 1e6)
	var creds []credentials.Credential
	keys := map[uint32]*wire.Key{}
	for _, c := range v.Credentials {
		sec, err := c.Secret()
		if err != nil {
			t.Fatal(err)
		}
		creds = append(creds, credentials.Credential{Tenant: c.Tenant, KeyID: c.KeyID, Secret: sec, MaxHorizon: time.Duration(c.MaxHorizonMs) * time.Millisecond})
		keys[c.KeyID], _ = wire.NewKey(c.KeyID, sec)
	}
	s := startServer(t, clk, func(cfg *Config) { cfg.Credentials = creds; cfg.Workers = 1; cfg.SweepInterval = time.Hour })
	if s.Epoch() != v.ServerStartMs {
		t.Fatalf("epoch %d, want %d", s.Epoch(), v.ServerStartMs)
	}
	w := newWorker(s, 99, nil) // the running worker stays idle: no datagram reaches its socket
	out := make([]byte, 0, wire.MaxDatagram)
	for i, st := range v.Steps {
		clk.ns.Store(int64(st.AtMs) * 1e6)
		pkt, err := hex.DecodeString(st.DatagramHex)
		if err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
		var before [numDrops]uint64
		for r := range before {
			before[r] = w.d[r].Load()
		}
		k := w.handle(pkt, false, out)
		switch st.Expect {
		case "answer":
			if k == 0 {
				t.Fatalf("step %d (%s): no answer", i, st.Comment)
			}
			checkAnswer(t, i, st, keys, out[:k])
		case "none", "drop":
			if k != 0 {
				t.Fatalf("step %d (%s): answered, want %s", i, st.Comment, st.Expect)
			}
			for r := drop(0); r < numDrops; r++ {
				d := w.d[r].Load() - before[r]
				want := uint64(0)
				if st.Expect == "drop" && dropNames[r] == st.DropReason {
					want = 1
				}
				if d != want {
					t.Fatalf("step %d (%s): drop %s counted %d, want %d", i, st.Comment, dropNames[r], d, want)
				}
			}
		default:
			t.Fatalf("step %d: unknown expect %q", i, st.Expect)
		}
	}
	for _, b := range v.StateAfter.Buckets {
		var ke *keyEntry
		for _, e := range s.keys {
			if string(e.prefix[2:]) == b.Tenant {
				ke = e
			}
		}
		key := append(append([]byte(nil), ke.prefix...), b.Bucket...)
		sh := &s.buckets.shards[s.buckets.shardIndex(key)]
		sh.mu.Lock()
		bk := sh.m[string(key)]
		sh.mu.Unlock()
		if bk == nil || math.Abs(bk.tokens-b.Tokens) > 1e-9 {
			t.Errorf("bucket %s/%s: %+v, want %v tokens", b.Tenant, b.Bucket, bk, b.Tokens)
		}
	}
}

func checkAnswer(t *testing.T, i int, st protovec.Step, keys map[uint32]*wire.Key, pkt []byte) {
	t.Helper()
	a := st.Answer
	var h wire.Header
	if err := h.Decode(pkt); err != nil {
		t.Fatalf("step %d: answer header: %v", i, err)
	}
	pt, err := keys[a.KeyID].Open(pkt, &h)
	if err != nil {
		t.Fatalf("step %d: answer does not open with key %d: %v", i, a.KeyID, err)
	}
	id, _ := protovec.ParseID(a.RequestID)
	want := wire.Header{Kind: wire.KindRateResponse, Flags: a.Flags, Attempt: a.Attempt, TTLms: a.TTLms, KeyID: a.KeyID,
		RequestID: id, Timestamp: a.TimestampMs, Nonce: h.Nonce}
	if h != want {
		t.Errorf("step %d (%s): header %+v, want %+v", i, st.Comment, h, want)
	}
	body, _ := hex.DecodeString(a.BodyHex)
	if !bytes.Equal(pt, body) {
		t.Errorf("step %d (%s): body\n got %x\nwant %x", i, st.Comment, pt, body)
	}
}
