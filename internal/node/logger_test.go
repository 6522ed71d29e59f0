package node

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"testing"
	"time"
)

// JSON log lines write durations as Go duration strings, never as a bare
// count of nanoseconds ("ttl":30000000000); other values stay as they are.
func TestJSONLogDurations(t *testing.T) {
	var buf bytes.Buffer
	log, err := NewLogger("json", "info", &buf)
	if err != nil {
		t.Fatal(err)
	}
	log.Info("membership", "ttl", 30*time.Second, "n", 3,
		slog.Group("g", slog.Duration("d", 1500*time.Microsecond)), "ms", 2.5)
	var m map[string]any
	if err := json.Unmarshal(buf.Bytes(), &m); err != nil {
		t.Fatalf("%q: %v", buf.String(), err)
	}
	g, _ := m["g"].(map[string]any)
	if m["ttl"] != "30s" || g["d"] != "1.5ms" || m["n"] != float64(3) || m["ms"] != 2.5 {
		t.Fatalf("line %s", buf.String())
	}
}
