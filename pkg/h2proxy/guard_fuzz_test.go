package h2proxy

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"testing"
)

// FuzzFrameGuard feeds arbitrary client bytes, in reads of arbitrary
// sizes, to the frame guard (budget, SETTINGS rewrite, header checks)
// and the same bytes, as if written, to the write side's frame follower:
// nothing panics, a rewrite keeps the length, and the write side passes
// every byte while nothing is due.
func FuzzFrameGuard(f *testing.F) {
	for _, s := range frameGuardSeeds() {
		f.Add(s.in, s.chunk)
	}
	f.Fuzz(func(t *testing.T, in []byte, chunk uint8) {
		step := int(chunk%32) + 1
		var g frameGuard
		g.init(nil)
		g.skip = 0
		g.hb.init(4096, 16<<10)
		buf := append([]byte(nil), in...)
		for i := 0; i < len(buf); i += step {
			p := buf[i:min(i+step, len(buf))]
			if l := g.settingsLen; l > 0 && g.left == l && len(p) >= int(l) {
				before := len(p)
				dedupSettings(p[:l])
				if len(p) != before {
					t.Fatal("rewrite changed the length")
				}
			}
			if !g.scan(p) {
				break
			}
			g.hb.reset = 0
		}
		client, server := net.Pipe()
		defer client.Close()
		co := newCoalescer(server)
		co.fw = &frameWriter{w: co}
		co.mu.Lock()
		for i := 0; i < len(in); i += step {
			p := in[i:min(i+step, len(in))]
			if k := co.fw.cut(p); k != len(p) {
				t.Fatalf("cut passed %d of %d bytes with nothing due", k, len(p))
			}
		}
		co.mu.Unlock()
	})
}

type frameGuardSeed struct {
	in    []byte
	chunk uint8
}

// frameGuardSeeds are the committed corpus's inputs: a request with a
// connection-specific field, a repeated SETTINGS parameter and a PRIORITY
// frame, a padded prioritised HEADERS continued, an empty DATA frame.
func frameGuardSeeds() []frameGuardSeed {
	hdrs := frameBytes(frameHeaders, flagEndHeaders, 1, []byte{0x82, 0x86, 0x84, 0x41, 0x01, 'a', 0x40, 0x0a, 'c', 'o', 'n', 'n', 'e', 'c', 't', 'i', 'o', 'n', 0x01, 'x'})
	return []frameGuardSeed{
		{hdrs, 3},
		{append(frameBytes(frameSettings, 0, 0, settingsPayload(4, 1, 4, 2)), frameBytes(framePriority, 0, 3, []byte{0, 0, 0, 0, 1})...), 1},
		{append(frameBytes(frameHeaders, flagPadded|flagPriority, 3, []byte{2, 0, 0, 0, 0, 9, 0x82, 0, 0}),
			frameBytes(frameContinuation, flagEndHeaders, 3, []byte{0x86})...), 7},
		{frameBytes(frameData, 0, 1, nil), 9},
	}
}

// TestWriteFrameGuardCorpus regenerates testdata/fuzz/FuzzFrameGuard from
// frameGuardSeeds when H2PROXY_WRITE_CORPUS=1.
func TestWriteFrameGuardCorpus(t *testing.T) {
	if os.Getenv("H2PROXY_WRITE_CORPUS") != "1" {
		t.Skip("set H2PROXY_WRITE_CORPUS=1 to regenerate the seed corpus")
	}
	dir := filepath.Join("testdata", "fuzz", "FuzzFrameGuard")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for i, s := range frameGuardSeeds() {
		body := "go test fuzz v1\n[]byte(" + strconv.Quote(string(s.in)) + ")\nbyte(" + strconv.QuoteRune(rune(s.chunk)) + ")\n"
		if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("seed%d", i)), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}
