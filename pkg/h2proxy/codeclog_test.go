package h2proxy

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"
)

// recHandler records slog records.
type recHandler struct {
	mu   sync.Mutex
	recs []slog.Record
}

func (h *recHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h *recHandler) Handle(_ context.Context, r slog.Record) error {
	h.mu.Lock()
	h.recs = append(h.recs, r.Clone())
	h.mu.Unlock()
	return nil
}
func (h *recHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *recHandler) WithGroup(string) slog.Handler      { return h }

func attr(r slog.Record, key string) (slog.Value, bool) {
	var v slog.Value
	found := false
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == key {
			v, found = a.Value, true
			return false
		}
		return true
	})
	return v, found
}

// TestCodecLogRateLimited: the codec's lines reach the logger, a panic at
// error level and counted, at most codecLogBurst lines a window, the
// number dropped told with the next line logged.
func TestCodecLogRateLimited(t *testing.T) {
	h := &recHandler{}
	lg := slog.New(h)
	now := time.Unix(1000, 0)
	var kinds []string
	l := &codecLog{log: func() *slog.Logger { return lg }, now: func() time.Time { return now },
		count: func(k string) { kinds = append(kinds, k) }}
	if _, err := l.Write([]byte("http2: panic serving 10.0.0.1:5: close of closed channel\ngoroutine 1\n")); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 50; i++ {
		_, _ = l.Write([]byte("http2: server connection error from 10.0.0.1:5: PROTOCOL_ERROR\n"))
	}
	if len(h.recs) != codecLogBurst {
		t.Fatalf("%d lines logged in one window, want %d", len(h.recs), codecLogBurst)
	}
	if h.recs[0].Level != slog.LevelError || !strings.Contains(h.recs[0].Message, "panic") {
		t.Fatalf("panic logged as %v %q", h.recs[0].Level, h.recs[0].Message)
	}
	if v, _ := attr(h.recs[0], "line"); !strings.Contains(v.String(), "close of closed channel") {
		t.Fatalf("panic line %q", v)
	}
	if h.recs[1].Level != slog.LevelWarn {
		t.Fatalf("connection error logged at %v", h.recs[1].Level)
	}
	if len(kinds) != 1 || kinds[0] != "handler_panic" {
		t.Fatalf("counted %v", kinds)
	}
	now = now.Add(codecLogWindow)
	_, _ = l.Write([]byte("http2: panic serving 10.0.0.1:6: boom\n"))
	if len(h.recs) != codecLogBurst+1 {
		t.Fatalf("next window: %d lines", len(h.recs))
	}
	last := h.recs[len(h.recs)-1]
	if v, ok := attr(last, "suppressed"); !ok || v.Int64() != 41 {
		t.Fatalf("suppressed %v (present %v), want 41", v, ok)
	}
	if len(kinds) != 2 {
		t.Fatalf("second panic not counted: %v", kinds)
	}
}
