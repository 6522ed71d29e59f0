package httpparse

import (
	"bytes"
	"strings"
	"testing"
)

// decodeAll runs d over in, handing it at most step new bytes at a time the
// way a proxy does (unconsumed bytes stay in the buffer). It returns the body,
// the trailers as "name: value" lines, the bytes left after the body, and the
// error.
func decodeAll(in []byte, step int, lim Limits) (body []byte, trailers []string, rest []byte, err error) {
	var d ChunkedDecoder
	d.Reset(lim)
	var buf []byte
	off := 0
	for {
		for !d.Done() {
			n, data, derr := d.Decode(buf)
			body = append(body, data...)
			buf = buf[n:]
			if derr == ErrNeedMore {
				break
			}
			if derr != nil {
				return body, nil, nil, derr
			}
		}
		if d.Done() {
			for _, h := range d.Trailers {
				trailers = append(trailers, string(h.Name)+": "+string(h.Value))
			}
			return body, trailers, append(buf, in[off:]...), nil
		}
		if off == len(in) {
			return body, nil, nil, ErrNeedMore
		}
		e := off + step
		if e > len(in) {
			e = len(in)
		}
		buf = append(buf, in[off:e]...)
		off = e
	}
}

func TestChunkedValid(t *testing.T) {
	cases := []struct {
		name, in, body string
		trailers       []string
	}{
		{"simple", "5\r\nhello\r\n0\r\n\r\n", "hello", nil},
		{"two chunks", "3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n", "abcde", nil},
		{"upper hex", "A\r\n0123456789\r\n0\r\n\r\n", "0123456789", nil},
		{"leading zeros 16 digits", "0000000000000003\r\nabc\r\n0\r\n\r\n", "abc", nil},
		{"extensions", "3;foo\r\nabc\r\n2;a=b;c=\"q \\\" x\"\r\nde\r\n0;last\r\n\r\n", "abcde", nil},
		{"trailers", "1\r\nx\r\n0\r\nX-Sum: 1\r\nY:\t2 \r\n\r\n", "x", []string{"X-Sum: 1", "Y: 2"}},
		{"empty body", "0\r\n\r\n", "", nil},
		{"crlf in data", "4\r\n\r\n\r\n\r\n0\r\n\r\n", "\r\n\r\n", nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			for _, step := range []int{1, 2, 3, 7, 1 << 20} {
				body, tr, rest, err := decodeAll([]byte(tc.in+"NEXT"), step, Limits{})
				if err != nil {
					t.Fatalf("step %d: %v", step, err)
				}
				if string(body) != tc.body || strings.Join(tr, "|") != strings.Join(tc.trailers, "|") || string(rest) != "NEXT" {
					t.Fatalf("step %d: body %q trailers %q rest %q", step, body, tr, rest)
				}
			}
		})
	}
}

var chunkRuleCases = []struct {
	name string
	in   string
	want *Error
}{
	{"empty size", "\r\nabc\r\n0\r\n\r\n", ErrBadChunkSize},
	{"non-hex", "g\r\n", ErrBadChunkSize},
	{"sign", "+5\r\nhello\r\n", ErrBadChunkSize},
	{"0x prefix", "0x5\r\nhello\r\n", ErrBadChunkSize},
	{"space after size", "5 \r\nhello\r\n", ErrBadChunkSize},
	{"space before size", " 5\r\nhello\r\n", ErrBadChunkSize},
	{"17 digits", "00000000000000005\r\nhello\r\n", ErrBadChunkSize},
	{"overflow", "8000000000000000\r\n", ErrChunkSizeOverflow},
	{"overflow ffff", "ffffffffffffffff\r\n", ErrChunkSizeOverflow},
	{"bare lf size line", "5\nhello\r\n0\r\n\r\n", ErrChunkMissingCRLF},
	{"bare cr size line", "5\r;a\r\nhello\r\n", ErrBareCR},
	{"nul in size line", "5;\x00\r\nhello\r\n", ErrNUL},
	{"data without crlf", "5\r\nhelloX\r\n0\r\n\r\n", ErrChunkMissingCRLF},
	{"data then lf", "5\r\nhello\n0\r\n\r\n", ErrChunkMissingCRLF},
	{"data cr then x", "5\r\nhello\rx0\r\n\r\n", ErrChunkMissingCRLF},
	{"ext bws", "5 ;a=b\r\nhello\r\n", ErrBadChunkSize},
	{"ext space after semicolon", "5; a\r\nhello\r\n", ErrBadChunkExt},
	{"ext empty name", "5;=b\r\nhello\r\n", ErrBadChunkExt},
	{"ext empty value", "5;a=\r\nhello\r\n", ErrBadChunkExt},
	{"ext bad token", "5;a(b)\r\nhello\r\n", ErrBadChunkExt},
	{"ext unterminated quote", "5;a=\"b\r\nhello\r\n", ErrBadChunkExt},
	{"ext junk after quote", "5;a=\"b\"c\r\nhello\r\n", ErrBadChunkExt},
	{"ext trailing semicolon", "5;\r\nhello\r\n", ErrBadChunkExt},
	{"line too long", "5;" + strings.Repeat("a", MaxChunkLine) + "\r\nhello\r\n", ErrChunkLineTooLong},
	{"line too long incomplete", "5;" + strings.Repeat("a", MaxChunkLine+10), ErrChunkLineTooLong},
	{"overhead", strings.Repeat("1;"+strings.Repeat("e", 1000)+"\r\nx\r\n", 20), ErrChunkOverhead},
	{"trailer obs-fold", "0\r\nA: 1\r\n b\r\n\r\n", ErrObsFold},
	{"trailer space before colon", "0\r\nA : 1\r\n\r\n", ErrSpaceBeforeColon},
	{"trailer bad name", "0\r\nA@: 1\r\n\r\n", ErrBadHeaderName},
	{"trailer bare lf", "0\r\nA: 1\n\r\n", ErrBareLF},
	{"trailer nul", "0\r\nA: \x00\r\n\r\n", ErrNUL},
	{"trailer missing final crlf lf", "0\r\n\n", ErrBareLF},
	{"trailer too big", "0\r\nA: " + strings.Repeat("a", DefaultMaxHeaderBytes) + "\r\n\r\n", ErrHeaderTooBig},
}

func TestChunkedRules(t *testing.T) {
	for _, tc := range chunkRuleCases {
		t.Run(tc.name, func(t *testing.T) {
			for _, step := range []int{1, 5, 1 << 20} {
				_, _, _, err := decodeAll([]byte(tc.in), step, Limits{})
				if err != tc.want {
					t.Fatalf("step %d: err %v, want %v", step, err, tc.want)
				}
			}
		})
	}
}

func TestChunkedTrailerLimits(t *testing.T) {
	_, _, _, err := decodeAll([]byte("0\r\nA: 1\r\nB: 2\r\n\r\n"), 1<<20, Limits{MaxHeaders: 1})
	if err != ErrTooManyHeaders {
		t.Fatalf("err %v", err)
	}
}

func TestChunkedIncomplete(t *testing.T) {
	for _, in := range []string{"", "5", "5\r", "5\r\nhel", "5\r\nhello", "5\r\nhello\r", "5\r\nhello\r\n0\r\n", "5\r\nhello\r\n0\r\nA: b\r\n"} {
		if _, _, _, err := decodeAll([]byte(in), 1<<20, Limits{}); err != ErrNeedMore {
			t.Errorf("%q: %v", in, err)
		}
	}
}

func TestAppendChunkHeader(t *testing.T) {
	for n, want := range map[int]string{1: "1\r\n", 15: "f\r\n", 16: "10\r\n", 4096: "1000\r\n", 1<<40 + 5: "10000000005\r\n"} {
		if got := string(AppendChunkHeader([]byte("x"), n)); got != "x"+want {
			t.Errorf("%d: %q", n, got)
		}
	}
	// Round trip through the decoder.
	var enc []byte
	payload := bytes.Repeat([]byte("0123456789"), 50)
	for i := 0; i < len(payload); i += 77 {
		e := min(i+77, len(payload))
		enc = AppendChunkHeader(enc, e-i)
		enc = append(enc, payload[i:e]...)
		enc = append(enc, "\r\n"...)
	}
	enc = append(enc, LastChunk...)
	body, _, rest, err := decodeAll(enc, 13, Limits{})
	if err != nil || !bytes.Equal(body, payload) || len(rest) != 0 {
		t.Fatalf("round trip: %v %d %q", err, len(body), rest)
	}
}
