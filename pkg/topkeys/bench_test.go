package topkeys

import (
	"fmt"
	"testing"
	"time"
)

// BenchmarkAllow is the allow path's cost: hash a rendered bucket and add
// to three counters, from every P at once (contended counters).
func BenchmarkAllow(b *testing.B) {
	z := NewRegistry(Plain, nil).Zone("z")
	keys := make([][]byte, 1024)
	for i := range keys {
		keys[i] = fmt.Appendf(nil, "client:10.0.%d.%d", i/256, i%256)
	}
	now := time.Now().UnixNano()
	z.Allow(keys[0], now)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		i := 0
		for pb.Next() {
			z.Allow(keys[i&1023], now)
			i++
		}
	})
}

// BenchmarkDeny is the deny path's cost with more keys than counters
// (every deny of a new key scans for the smallest counter).
func BenchmarkDeny(b *testing.B) {
	z := NewRegistry(Plain, nil).Zone("z")
	keys := make([][]byte, 1024)
	for i := range keys {
		keys[i] = fmt.Appendf(nil, "client:10.0.%d.%d", i/256, i%256)
	}
	now := time.Now().UnixNano()
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		z.Deny(keys[i&1023], now)
		i++
	}
}
