package h2proxy

import (
	"bytes"
	"encoding/binary"
	"io"
	"net"
	"testing"
	"time"

	"golang.org/x/net/http2/hpack"
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
		{"three times between others", settingsPayload(4, 1, 3, 10, 4, 2, 4, 3), settingsPayload(0xf000, 1, 3, 10, 0xf001, 2, 4, 3)},
		{"replacement ids the frame holds skipped", settingsPayload(4, 1, 0xf000, 9, 4, 2), settingsPayload(0xf001, 1, 0xf000, 9, 4, 2)},
		{"unknown parameter twice", settingsPayload(0xabcd, 1, 0xabcd, 2), settingsPayload(0xf000, 1, 0xabcd, 2)},
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

// TestHeaderCheckLayouts: the header checks find a connection-specific
// field whatever the block's framing (padding, priority, CONTINUATION
// frames, one byte a read), and only in a request's first block.
func TestHeaderCheckLayouts(t *testing.T) {
	var hb bytes.Buffer
	enc := hpack.NewEncoder(&hb)
	block := func(fields ...string) []byte {
		hb.Reset()
		for i := 0; i+1 < len(fields); i += 2 {
			// Never indexed: each block stands alone (no dynamic table).
			_ = enc.WriteField(hpack.HeaderField{Name: fields[i], Value: fields[i+1], Sensitive: true})
		}
		return bytes.Clone(hb.Bytes())
	}
	req := []string{":method", "GET", ":scheme", "http", ":path", "/", ":authority", "a"}
	bad := block(append(req, "connection", "close")...)
	good := block(append(req, "te", "trailers")...)
	trailers := block("upgrade", "x") // a trailer block of stream 1: not a request
	padded := func(b []byte, pad int) []byte {
		return append(append([]byte{byte(pad)}, b...), make([]byte, pad)...)
	}
	prio := func(b []byte) []byte { return append([]byte{0, 0, 0, 0, 15}, b...) }
	for _, tc := range []struct {
		name   string
		frames []byte
		want   uint32
	}{
		{"plain", frameBytes(frameHeaders, flagEndHeaders, 1, bad), 1},
		{"valid", frameBytes(frameHeaders, flagEndHeaders, 1, good), 0},
		{"padded", frameBytes(frameHeaders, flagEndHeaders|flagPadded, 3, padded(bad, 7)), 3},
		{"priority", frameBytes(frameHeaders, flagEndHeaders|flagPriority, 5, prio(bad)), 5},
		{"padded priority", frameBytes(frameHeaders, flagEndHeaders|flagPadded|flagPriority, 7, padded(prio(bad), 3)), 7},
		{"continuation", append(frameBytes(frameHeaders, 0, 9, bad[:5]),
			append(frameBytes(frameContinuation, 0, 9, bad[5:9]), frameBytes(frameContinuation, flagEndHeaders, 9, bad[9:])...)...), 9},
		{"trailers", append(frameBytes(frameHeaders, flagEndHeaders, 1, good), frameBytes(frameHeaders, flagEndHeaders|flagEndStream, 1, trailers)...), 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var g frameGuard
			g.init(nil)
			g.skip = 0
			g.hb.init(4096, 16<<10)
			var got uint32
			for i := range tc.frames {
				g.scan(tc.frames[i : i+1])
				if g.hb.reset != 0 {
					got, g.hb.reset = g.hb.reset, 0
				}
			}
			if got != tc.want || g.hb.broken {
				t.Fatalf("reset %d (broken %v), want %d", got, g.hb.broken, tc.want)
			}
		})
	}
}
