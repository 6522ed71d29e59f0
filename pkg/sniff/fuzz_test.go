package sniff

import (
	"bytes"
	"os"
	"testing"

	"github.com/rl-tproxy/rl-tproxy/internal/fuzzcorpus"
)

// goHello is a ClientHello captured from crypto/tls (SNI "www.example.com",
// ALPN h2 and http/1.1; see TestCapturedHello).
const goHelloFile = "testdata/clienthello-go.bin"

func helloSeeds(t testing.TB) [][]byte {
	real, err := os.ReadFile(goHelloFile)
	if err != nil {
		t.Fatal(err)
	}
	alpn := ext(16, []byte{0, 12, 2, 'h', '2', 8, 'h', 't', 't', 'p', '/', '1', '.', '1'})
	return [][]byte{
		real,
		fragment(real, 64),
		fragment(real, 2),
		hello(nil),
		hello(append(sni("api.example"), alpn...)),
		hello(sni("a", "b")),
		hello(append(alpn, alpn...)),
		[]byte{0x16, 3, 1, 0, 4, 1, 0xff, 0xff, 0xff},
		[]byte(Preface),
		[]byte("GET / HTTP/1.1\r\nHost: a\r\n\r\n"),
		[]byte("SSH-2.0-OpenSSH_9.2p1 Debian-2+deb12u3\r\n"),
	}
}

// detectSeeds adds to helloSeeds the request lines a lenient server
// parses and a strict one does not (leading whitespace, other separators
// than SP), and text protocols that stay opaque.
func detectSeeds(t testing.TB) [][]byte {
	return append(helloSeeds(t),
		[]byte(" GET /admin HTTP/1.1\r\nHost: a\r\n\r\n"),
		[]byte("GET\t/admin\tHTTP/1.1\r\nHost: a\r\n\r\n"),
		[]byte("GET\v/admin\x1fHTTP/1.1\r\n\r\n"),
		[]byte("\xa0GET\xa0/admin\r\n"),
		[]byte("get\r/admin\r\n"),
		[]byte("SSH-2.0-x y http/1.1\r\n"),
		[]byte("SSH-2.0-x y\x00\r\n"),
		[]byte("PING\r\n"),
		[]byte("*1\r\n$4\r\nPING\r\n"),
	)
}

// TestHelloCorpus checks that testdata/fuzz/FuzzParseHello and
// FuzzDetect hold the generated seeds (RL_WRITE_CORPUS=1 rewrites them).
func TestHelloCorpus(t *testing.T) {
	fuzzcorpus.Sync(t, "FuzzParseHello", helloSeeds(t))
	fuzzcorpus.Sync(t, "FuzzDetect", detectSeeds(t))
}

// TestCapturedHello: the committed capture is a real, parseable hello.
func TestCapturedHello(t *testing.T) {
	b, err := os.ReadFile(goHelloFile)
	if err != nil {
		t.Fatal(err)
	}
	var h Hello
	if err := ParseHello(b, nil, &h); err != nil || string(h.SNI) != "www.example.com" || string(h.FirstALPN()) != "h2" {
		t.Fatalf("%v SNI %q ALPN %q", err, h.SNI, h.FirstALPN())
	}
}

// FuzzParseHello: no input panics; an accepted hello is self-consistent
// (its records alone parse the same, one byte less needs more, the SNI is
// a host name, the ALPN list walks to its end) and Detect agrees.
func FuzzParseHello(f *testing.F) {
	scratch := make([]byte, MaxHello+4)
	f.Fuzz(func(t *testing.T, data []byte) {
		var h Hello
		err := ParseHello(data, scratch, &h)
		k := Detect(data)
		if err != nil {
			if err == ErrNeedMore && k != NeedMore && k != TLS {
				t.Fatalf("needs more but Detect says %v", k)
			}
			return
		}
		if k != TLS {
			t.Fatalf("parsed, Detect says %v", k)
		}
		if h.Len < 9 || h.Len > len(data) {
			t.Fatalf("Len %d of %d", h.Len, len(data))
		}
		sni, alpn := bytes.Clone(h.SNI), bytes.Clone(h.ALPN)
		var h2 Hello
		if err := ParseHello(data[:h.Len], scratch, &h2); err != nil || !bytes.Equal(h2.SNI, sni) || !bytes.Equal(h2.ALPN, alpn) {
			t.Fatalf("records alone: %v", err)
		}
		if err := ParseHello(data[:h.Len-1], scratch, &h2); err != ErrNeedMore {
			t.Fatalf("one byte less: %v", err)
		}
		if sni != nil && !validHost(sni) {
			t.Fatalf("SNI %q", sni)
		}
		n := 0
		h.Protocols(func(p []byte) bool { n += 1 + len(p); return len(p) > 0 })
		if n != len(alpn) {
			t.Fatalf("ALPN walked %d of %d", n, len(alpn))
		}
	})
}

// FuzzDetect: a decided kind never changes when more bytes arrive, and
// no first line that a lenient server could split into a method and an
// origin-form or asterisk-form target is Other.
func FuzzDetect(f *testing.F) {
	f.Fuzz(func(t *testing.T, data []byte) {
		k := Detect(data)
		if k == Other && len(data) > 0 && data[0] != 0x16 {
			line, _, _ := bytes.Cut(data, []byte("\n"))
			words := fields(line)
			if len(words) >= 2 && (words[1][0] == '/' || words[1][0] == '*') && isToken(words[0]) {
				t.Fatalf("request line %q is Other", line)
			}
		}
		for _, n := range []int{len(data) / 2, len(data) - 1} {
			if n < 0 {
				continue
			}
			if p := Detect(data[:n]); p != NeedMore && p != k {
				t.Fatalf("prefix %d: %v, whole: %v", n, p, k)
			}
		}
	})
}

// fields splits a line on isSpace bytes (bytes.FieldsFunc would decode
// UTF-8 and miss 0x85 and 0xa0).
func fields(line []byte) [][]byte {
	var words [][]byte
	start := -1
	for i, c := range line {
		switch {
		case isSpace(c) && start >= 0:
			words = append(words, line[start:i])
			start = -1
		case !isSpace(c) && start < 0:
			start = i
		}
	}
	if start >= 0 {
		words = append(words, line[start:])
	}
	return words
}

func isToken(b []byte) bool {
	for _, c := range b {
		if !isTchar(c) {
			return false
		}
	}
	return len(b) > 0
}
