package wire

import (
	"bufio"
	"bytes"
	"encoding/hex"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

// The byte-exact examples of docs/protocol.md ("Examples"). The test
// rebuilds every datagram from these values and compares it with the hex
// block of the same name in the document, then opens the document's bytes
// and compares the decoded body.

var exampleSecret = func() (s [KeyLen]byte) {
	for i := range s {
		s[i] = byte(i) // 00 01 02 ... 1f
	}
	return s
}()

const exampleKeyID = 0x0000002a

func exampleNonce(first byte) (n [NonceLen]byte) {
	for i := range n {
		n[i] = first + byte(i)
	}
	return n
}

var exampleRequest = RateRequest{
	Label:     []byte("api"),
	Guards:    []Guard{{Service: []byte("checkout"), ThresholdMs: 250}},
	Resources: []Resource{{Bucket: []byte("client:192.0.2.10"), Rate: 100, PeriodMs: 1000, Burst: 50, Cost: 1}},
}

type example struct {
	name string
	h    Header
	body Body
	out  Body // empty struct of the same kind for decoding
}

func examples() []example {
	return []example{
		{"rate_request", Header{TTLms: 60, RequestID: 0x0123456789abcdef, Timestamp: 1767225600000, Nonce: exampleNonce(0x40)},
			&exampleRequest, &RateRequest{}},
		{"rate_response", Header{Flags: FlagSteering, TTLms: 60, RequestID: 0x0123456789abcdef, Timestamp: 1767225600003, Nonce: exampleNonce(0x60)},
			&RateResponse{Status: StatusOK, Success: true, ServerEpoch: 1767222000000,
				Guards: []GuardResult{{Passed: true, ObservedMs: 120}}, Resources: []ResourceResult{{Remaining: 49}}}, &RateResponse{}},
		{"rate_response_deny", Header{Flags: FlagSteering | FlagReplay, Attempt: 1, TTLms: 60, RequestID: 0x0123456789abcdf0, Timestamp: 1767225600025, Nonce: exampleNonce(0x70)},
			&RateResponse{Status: StatusOK, Success: false, ServerEpoch: 1767222000000,
				Guards: []GuardResult{{Passed: true, ObservedMs: 120}}, Resources: []ResourceResult{{Remaining: 0, TokensDeficit: 1, RetryAfterMs: 10}}}, &RateResponse{}},
		{"latency_report", Header{TTLms: 60, RequestID: 0xfedcba9876543210, Timestamp: 1767225600040, Nonce: exampleNonce(0x80)},
			&LatencyReport{Entries: []ReportEntry{{Service: []byte("checkout"), DurationMs: 37}}}, &LatencyReport{}},
		{"completion", Header{TTLms: 60, RequestID: 0x0123456789abcdef, Timestamp: 1767225600005, Nonce: exampleNonce(0xa0)},
			&Completion{Decision: DecisionAllow, Request: exampleRequest}, &Completion{}},
	}
}

// docHexBlocks returns the hex blocks of docs/protocol.md keyed by the name
// in the "<!-- example: NAME -->" line that precedes each ```hex fence.
func docHexBlocks(t *testing.T) map[string][]byte {
	t.Helper()
	f, err := os.Open(filepath.Join("..", "..", "..", "docs", "protocol.md"))
	if err != nil {
		t.Fatalf("open protocol doc: %v", err)
	}
	defer f.Close()
	blocks := map[string][]byte{}
	sc := bufio.NewScanner(f)
	name, in := "", false
	var buf strings.Builder
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		switch {
		case strings.HasPrefix(line, "<!-- example: "):
			name = strings.TrimSuffix(strings.TrimPrefix(line, "<!-- example: "), " -->")
		case line == "```hex" && name != "":
			in = true
			buf.Reset()
		case line == "```" && in:
			in = false
			b, err := hex.DecodeString(buf.String())
			if err != nil {
				t.Fatalf("example %s: bad hex: %v", name, err)
			}
			blocks[name] = b
			name = ""
		case in:
			// strip an "offset:" column if present
			if i := strings.Index(line, ":"); i >= 0 {
				line = line[i+1:]
			}
			buf.WriteString(strings.ReplaceAll(line, " ", ""))
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return blocks
}

func TestProtocolDocExamples(t *testing.T) {
	k, err := NewKey(exampleKeyID, exampleSecret)
	if err != nil {
		t.Fatal(err)
	}
	doc := docHexBlocks(t)
	for _, ex := range examples() {
		h := ex.h
		got, err := k.SealNonce(nil, &h, ex.body)
		if err != nil {
			t.Fatalf("%s: %v", ex.name, err)
		}
		plain, _ := ex.body.AppendBody(nil)
		if wantPlain, ok := doc[ex.name+".plain"]; !ok || !bytes.Equal(plain, wantPlain) {
			t.Errorf("%s.plain: docs/protocol.md plaintext missing or different; the codec produces:\n%s", ex.name, hexDump(plain))
		}
		want, ok := doc[ex.name]
		if !ok {
			t.Errorf("%s: no hex block in docs/protocol.md; the codec produces:\n%s", ex.name, hexDump(got))
			continue
		}
		if !bytes.Equal(got, want) {
			t.Errorf("%s: docs/protocol.md bytes differ from the codec; the codec produces:\n%s", ex.name, hexDump(got))
			continue
		}
		var oh Header
		if err := k.OpenBody(bytes.Clone(want), &oh, ex.out); err != nil {
			t.Fatalf("%s: open doc bytes: %v", ex.name, err)
		}
		if !reflect.DeepEqual(ex.out, ex.body) || oh != h {
			t.Errorf("%s: decoded %+v %+v, want %+v %+v", ex.name, oh, ex.out, h, ex.body)
		}
	}
	if len(doc) != 2*len(examples()) {
		t.Errorf("docs/protocol.md has %d example blocks, the test knows %d", len(doc), 2*len(examples()))
	}
}

// hexDump formats b as the document does: 16 bytes a line with an offset.
func hexDump(b []byte) string {
	var s strings.Builder
	for i := 0; i < len(b); i += 16 {
		end := min(i+16, len(b))
		s.WriteString(strings.ToLower(hex.EncodeToString([]byte{byte(i >> 8), byte(i)})))
		s.WriteString(":")
		for _, c := range b[i:end] {
			s.WriteString(" ")
			s.WriteString(hex.EncodeToString([]byte{c}))
		}
		s.WriteString("\n")
	}
	return s.String()
}
