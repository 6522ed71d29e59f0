//go:build !race

package sniff

import (
	"os"
	"testing"
)

// TestNoAlloc: detection and ClientHello parsing (one record and
// fragmented) allocate nothing.
func TestNoAlloc(t *testing.T) {
	b, err := os.ReadFile(goHelloFile)
	if err != nil {
		t.Fatal(err)
	}
	frag := fragment(b, 100)
	scratch := make([]byte, MaxHello+4)
	var h Hello
	n := testing.AllocsPerRun(100, func() {
		if Detect(b) != TLS || Detect([]byte("GET / HTTP/1.1\r\n")) != HTTP1 {
			t.Fatal("detect")
		}
		if ParseHello(b, scratch, &h) != nil || ParseHello(frag, scratch, &h) != nil {
			t.Fatal("parse")
		}
	})
	if n != 0 {
		t.Fatalf("%v allocations per run", n)
	}
}

func BenchmarkParseHello(b *testing.B) {
	in, err := os.ReadFile(goHelloFile)
	if err != nil {
		b.Fatal(err)
	}
	var h Hello
	b.ReportAllocs()
	b.SetBytes(int64(len(in)))
	for b.Loop() {
		if Detect(in) != TLS || ParseHello(in, nil, &h) != nil {
			b.Fatal("parse")
		}
	}
}
