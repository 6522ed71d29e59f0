package node

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rl-tproxy/rl-tproxy/pkg/admission"
)

// namedUpstream serves HTTP answering name, until the test ends.
func namedUpstream(t *testing.T, name string) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, name) })}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return ln.Addr().String()
}

func writeTwoServices(t *testing.T, path, listenA, upA, listenB, upB string) {
	t.Helper()
	body := fmt.Sprintf(`ratelimitly:
  embedded: true
  fail: open
zones:
  z: {bucket: "all", rate: 1000/s}
services:
  - name: a
    listen: %s
    upstream: %s
    locations:
      - name: all
        limit: [z]
  - name: b
    listen: %s
    upstream: %s
    locations:
      - name: all
        limit: [z]
`, listenA, upA, listenB, upB)
	if err := os.WriteFile(path+".tmp", []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(path+".tmp", path); err != nil {
		t.Fatal(err)
	}
}

func startNode(t *testing.T, path string, watch bool) *Node {
	t.Helper()
	pol, err := admission.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	return startLoaded(t, pol, path, watch)
}

func startLoaded(t *testing.T, pol *admission.Policy, path string, watch bool) *Node {
	t.Helper()
	rt, err := Start(context.Background(), pol, Options{Policy: path, Admin: "off", Watch: watch,
		Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := rt.Shutdown(ctx); err != nil {
			t.Error(err)
		}
	})
	return rt
}

func getBody(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// A reload that swaps the listen addresses of two services is rejected
// (it would forward by the old service and limit by the new one): the old
// policy stays in force, and each address keeps its upstream.
func TestReloadRejectsListenAddressMove(t *testing.T) {
	upA, upB := namedUpstream(t, "a"), namedUpstream(t, "b")
	la, lb := freeAddr(t), freeAddr(t)
	path := filepath.Join(t.TempDir(), "policy.yaml")
	writeTwoServices(t, path, la, upA, lb, upB)
	rt := startNode(t, path, false)
	old := rt.pol
	if got := getBody(t, "http://"+la+"/"); got != "a" {
		t.Fatalf("before: %s answered %q, want a", la, got)
	}
	writeTwoServices(t, path, lb, upA, la, upB)
	err := rt.reloader.Reload(admission.TriggerSignal)
	if err == nil || !strings.Contains(err.Error(), "moves from service") || !strings.Contains(err.Error(), "restart to apply") {
		t.Fatalf("reload error %v, want a rejected move", err)
	}
	rt.mu.Lock()
	kept := rt.pol == old
	rt.mu.Unlock()
	if !kept {
		t.Fatal("the swapping policy was applied")
	}
	if got := getBody(t, "http://"+la+"/"); got != "a" {
		t.Fatalf("after: %s answered %q, want a", la, got)
	}
	if got := getBody(t, "http://"+lb+"/"); got != "b" {
		t.Fatalf("after: %s answered %q, want b", lb, got)
	}
}
