package simulate

import (
	"fmt"
	"testing"
	"time"
)

// BenchmarkReplayJSON replays JSON access lines of 1,000 clients, one a
// millisecond, through burst3Policy: the cost of one line, parse to
// decision.
func BenchmarkReplayJSON(b *testing.B) {
	var ls []line
	for i := range 4096 {
		ls = append(ls, line{at: time.Duration(i) * time.Millisecond, remote: fmt.Sprintf("10.0.%d.%d:4000", i%1000/256, i%256),
			path: "/api/items", loc: "api", outcome: "allow", cause: "allow", status: 200, durMs: 3})
	}
	lines := splitLines(writeLog(b, FormatJSON, ls))[1:]
	s, err := New(writePolicy(b, burst3Policy), Options{})
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		s.Line(lines[i%len(lines)])
		i++
	}
	if s.res.Malformed != 0 {
		b.Fatalf("%d malformed", s.res.Malformed)
	}
}

func splitLines(b []byte) [][]byte {
	var out [][]byte
	for len(b) > 0 {
		i := 0
		for i < len(b) && b[i] != '\n' {
			i++
		}
		out = append(out, b[:i])
		if i < len(b) {
			i++
		}
		b = b[i:]
	}
	return out
}
