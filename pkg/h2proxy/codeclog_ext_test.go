package h2proxy_test

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rl-tproxy/rl-tproxy/pkg/exchange"
)

// panicHook denies every request and panics in Done: a defect of the
// Hook's, run on the stream's handler.
type panicHook struct{}

func (panicHook) Admit(context.Context, *exchange.Request) exchange.Decision {
	return exchange.Decision{Status: 429, Body: []byte("denied\n"), ContentType: "text/plain"}
}
func (panicHook) Done(*exchange.Request, *exchange.Decision, *exchange.Result) { panic("hook defect") }

// TestCodecPanicLogged: a panic on a stream's handler, which the codec
// recovers from, is logged at error level through Server.Logger and
// counted ("handler_panic"), not discarded.
func TestCodecPanicLogged(t *testing.T) {
	srv, addr := startProxy(t, &exchange.Service{Name: "p", Upstream: "127.0.0.1:9"}, panicHook{})
	lines := make(chan string, 64)
	srv.Logger = slog.New(slog.NewTextHandler(lineWriter(lines), nil))
	var mu sync.Mutex
	var kinds []string
	srv.CountError = func(k string) { mu.Lock(); kinds = append(kinds, k); mu.Unlock() }
	cl := h2cClient()
	defer cl.CloseIdleConnections()
	if res, err := cl.Get("http://" + addr + "/x"); err == nil {
		_ = res.Body.Close()
	}
	var line string
	for !strings.Contains(line, "hook defect") {
		select {
		case line = <-lines:
		case <-time.After(10 * time.Second): // hang guard
			t.Fatal("no panic in the log")
		}
	}
	if !strings.Contains(line, "level=ERROR") {
		t.Fatalf("panic not logged at error level: %q", line)
	}
	mu.Lock()
	defer mu.Unlock()
	found := false
	for _, k := range kinds {
		found = found || k == "handler_panic"
	}
	if !found {
		t.Fatalf("panic not counted: %v", kinds)
	}
}

// lineWriter sends each write (one slog record) to ch, dropping it when
// ch is full.
type lineWriter chan string

func (w lineWriter) Write(p []byte) (int, error) {
	select {
	case w <- string(p):
	default:
	}
	return len(p), nil
}
