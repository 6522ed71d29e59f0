package h2proxy

import (
	"bytes"
	"encoding/binary"
	"io"
	"net"
	"testing"
	"time"
)

func settingsPayload(kv ...uint32) []byte {
	var b []byte
	for i := 0; i+1 < len(kv); i += 2 {
		b = binary.BigEndian.AppendUint16(b, uint16(kv[i]))
		b = binary.BigEndian.AppendUint32(b, kv[i+1])
	}
	return b
}

// TestDedupSettings: a parameter named more than once keeps its last
// value only; an invalid earlier value stays for the codec to refuse.
func TestDedupSettings(t *testing.T) {
	for _, tc := range []struct {
		name    string
		in, out []byte
	}{
		{"no repeat", settingsPayload(4, 100, 5, 1<<14), settingsPayload(4, 100, 5, 1<<14)},
		{"window twice", settingsPayload(4, 100, 4, 1), settingsPayload(0xf000, 100, 4, 1)},
		{"three times between others", settingsPayload(4, 1, 3, 10, 4, 2, 4, 3), settingsPayload(0xf000, 1, 3, 10, 0xf002, 2, 4, 3)},
		{"invalid earlier value kept", settingsPayload(4, 1<<31, 4, 1), settingsPayload(4, 1<<31, 4, 1)},
		{"invalid push kept", settingsPayload(2, 2, 2, 0), settingsPayload(2, 2, 2, 0)},
		{"one entry", settingsPayload(4, 1), settingsPayload(4, 1)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := bytes.Clone(tc.in)
			dedupSettings(p)
			if !bytes.Equal(p, tc.out) {
				t.Fatalf("got % x, want % x", p, tc.out)
			}
		})
	}
}

func frameBytes(typ byte, flags byte, stream uint32, payload []byte) []byte {
	b := []byte{byte(len(payload) >> 16), byte(len(payload) >> 8), byte(len(payload)), typ, flags}
	b = binary.BigEndian.AppendUint32(b, stream)
	return append(b, payload...)
}

// TestFrameWriterGoAwayAtBoundary: a GOAWAY asked for while a frame is
// half written goes out after that frame, and nothing written after it
// does; DATA frames are counted.
func TestFrameWriterGoAwayAtBoundary(t *testing.T) {
	client, server := net.Pipe()
	defer client.Close()
	co := newCoalescer(server)
	co.fw = &frameWriter{w: co}
	data := frameBytes(frameData, 0, 1, bytes.Repeat([]byte("d"), 100))
	got := make(chan []byte)
	go func() { b, _ := io.ReadAll(client); got <- b }()
	_, _ = co.Write(data[:50]) // half a DATA frame
	co.fw.goAway(7, errCodeEnhanceYourCalm)
	_, _ = co.Write(data[50:]) // its end, then the next frame
	_, _ = co.Write(frameBytes(frameHeaders, flagEndHeaders, 9, []byte{0x82}))
	_ = co.Close()
	var b []byte
	select {
	case b = <-got:
	case <-time.After(10 * time.Second): // hang guard
		t.Fatal("connection not closed")
	}
	want := append(bytes.Clone(data), frameBytes(frameGoAway, 0, 0, []byte{0, 0, 0, 7, 0, 0, 0, errCodeEnhanceYourCalm})...)
	if !bytes.Equal(b, want) {
		t.Fatalf("written % x\nwant    % x", b, want)
	}
	if n := co.fw.data.Load(); n != 1 {
		t.Fatalf("DATA frames counted %d, want 1", n)
	}
}

// TestFrameGuardSplitHeaders: frame headers split across reads are
// followed, the preface skipped, and the budget spent only by the
// flood frames.
func TestFrameGuardSplitHeaders(t *testing.T) {
	var g frameGuard
	g.init(nil)
	in := []byte(clientPreface)
	in = append(in, frameBytes(frameHeaders, flagEndHeaders, 5, []byte{0x82, 0x86})...)
	for range 3 {
		in = append(in, frameBytes(framePriority, 0, 3, []byte{0, 0, 0, 0, 15})...)
	}
	for i := range in { // one byte a read
		if !g.scan(in[i : i+1]) {
			t.Fatal("flooded")
		}
	}
	if g.maxStream != 5 || g.tokens != floodBudget-3 {
		t.Fatalf("maxStream %d, tokens %d", g.maxStream, g.tokens)
	}
	one := frameBytes(frameWindowUpdate, 0, 0, []byte{0, 0, 0, 1})
	var ok bool
	for range floodBudget {
		ok = g.scan(one)
	}
	if ok || g.tripped != frameWindowUpdate {
		t.Fatalf("after the budget: ok %v, tripped %d", ok, g.tripped)
	}
}
