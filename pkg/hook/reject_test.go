package hook

import (
	"bufio"
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rl-tproxy/rl-tproxy/internal/testkit"
	"github.com/rl-tproxy/rl-tproxy/pkg/exchange"
	"github.com/rl-tproxy/rl-tproxy/pkg/proxy"
)

// Every request the proxy answers itself is counted by status and reason
// and logged, at most once per second, with how many there were (issue
// 13 item 4): malformed heads and slowloris connections alike.
func TestRejectionsCountedAndLogged(t *testing.T) {
	var clock atomic.Int64
	clock.Store(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano())
	logs := &testkit.SyncBuffer{}
	g := New(Config{Logger: slog.New(slog.NewTextHandler(logs, nil)), Now: func() time.Time { return time.Unix(0, clock.Load()) }})
	g.Swap(loadPolicy(t, t.TempDir(), "open", "127.0.0.1:9"))
	g.SetChecker(&fakeChecker{fn: allowAll}, nil)
	svc := &exchange.Service{Name: "web", Upstream: "127.0.0.1:9", HeaderTimeout: 30 * time.Millisecond}
	p, err := proxy.New(proxy.Config{Config: exchange.Config{Services: []*exchange.Service{svc}, Hook: hookFor(g)}})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := proxy.Listen(context.Background(), "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = p.Serve(ln, svc) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = p.Shutdown(ctx)
	})
	addr := ln.Addr().String()
	malformed := []struct {
		req    string
		status int
	}{
		{"GET / HTTP/1.1\r\n\r\n", 400},                                             // missing Host
		{"GET /" + strings.Repeat("a", 9000) + " HTTP/1.1\r\nHost: x\r\n\r\n", 414}, // request line
		{"GET / HTTP/1.1\r\nHost: x\r\nX: " + strings.Repeat("h", 17000) + "\r\n\r\n", 431},
		{"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n\r\n", 501},
		{"GET / HTTP/1.2\r\nHost: x\r\n\r\n", 505},
		{"GET / HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n", 400},
	}
	const slow = 20
	for _, m := range malformed {
		if got := rejectedStatus(t, addr, m.req); got != m.status {
			t.Fatalf("%.40q: status %d, want %d", m.req, got, m.status)
		}
	}
	for i := 0; i < slow; i++ { // slowloris: a head that never ends
		if got := rejectedStatus(t, addr, "GET / HTTP/1.1\r\nHost: x\r\n"); got != 408 {
			t.Fatalf("slow head: status %d, want 408", got)
		}
	}
	got := map[string]float64{}
	reasons := map[string]bool{}
	fams, err := g.Metrics().Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() != "rl_tproxy_rejections_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			var status, reason string
			for _, l := range m.GetLabel() {
				switch l.GetName() {
				case "status":
					status = l.GetValue()
				case "reason":
					reason = l.GetValue()
				}
			}
			got[status] += m.GetCounter().GetValue()
			reasons[reason] = true
		}
	}
	wantByCode := map[string]float64{"400": 2, "408": slow, "414": 1, "431": 1, "501": 1, "505": 1}
	for code, n := range wantByCode {
		if got[code] != n {
			t.Fatalf("rejections by status %v, want %v", got, wantByCode)
		}
	}
	if !reasons["header-timeout"] || len(reasons) < 5 {
		t.Fatalf("reasons %v", reasons)
	}
	// All within one (frozen) second: one line (for the first). A second
	// later, the next rejection logs again and counts itself and the 25
	// that were not logged.
	if n := strings.Count(logs.String(), "request rejected by the proxy"); n != 1 {
		t.Fatalf("%d log lines, want 1:\n%s", n, logs.String())
	}
	clock.Add(int64(time.Second))
	rejectedStatus(t, addr, "GET / HTTP/1.1\r\n\r\n")
	out := logs.String()
	if n := strings.Count(out, "request rejected by the proxy"); n != 2 ||
		!strings.Contains(out, "reason=host-missing status=400 rejections_since_last_line=26") {
		t.Fatalf("log after a second:\n%s", out)
	}
}

// rejectedStatus sends req on a fresh connection and returns the status
// of the proxy's answer.
func rejectedStatus(t *testing.T, addr, req string) int {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(c, req); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("%.40q: %v", req, err)
	}
	resp.Body.Close()
	return resp.StatusCode
}
