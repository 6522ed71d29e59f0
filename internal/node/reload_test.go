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

	"github.com/rl-tproxy/rl-tproxy/internal/testkit"
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
	return startLoadedWith(t, pol, path, func(o *Options) { o.Watch = watch })
}

// startLoadedWith starts a node on pol with the options set adjusts.
func startLoadedWith(t *testing.T, pol *admission.Policy, path string, set func(*Options)) *Node {
	t.Helper()
	opts := Options{Policy: path, Admin: "off", Log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	set(&opts)
	rt, err := Start(context.Background(), pol, opts)
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

// When no client could be created and a reload's new policy cannot create
// one either, the log names the failure policy of the new policy (the one
// that now decides), not the previous one's.
func TestClientFailedLogsNewFailPolicy(t *testing.T) {
	path := filepath.Join(t.TempDir(), "policy.yaml")
	listen := freeAddr(t)
	write := func(fail string) {
		// 192.0.2.1 (TEST-NET-1) is on no interface: the client's UDP
		// sockets cannot bind, so no client is created.
		body := fmt.Sprintf(`ratelimitly:
  embedded: true
  bind: 192.0.2.1
  fail: %s
services:
  - name: web
    listen: %s
    upstream: 127.0.0.1:9
`, fail, listen)
		writeAtomicFile(t, path, body)
	}
	write("open")
	pol, err := admission.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	logs := &testkit.SyncBuffer{}
	rt, err := Start(context.Background(), pol, Options{Policy: path, Admin: "off",
		Log: slog.New(slog.NewTextHandler(logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = rt.Shutdown(ctx)
	})
	if !strings.Contains(logs.String(), "fail=open") {
		t.Fatalf("start: no client failure logged with fail=open:\n%s", logs.String())
	}
	write("close")
	if err := rt.reloader.Reload(admission.TriggerSignal); err != nil {
		t.Fatal(err)
	}
	var last string
	for _, line := range strings.Split(logs.String(), "\n") {
		if strings.Contains(line, "RateLimitly client not created") {
			last = line
		}
	}
	if !strings.Contains(last, "fail=close") {
		t.Fatalf("reload's client failure logged %q, want fail=close", last)
	}
}

func writeAtomicFile(t *testing.T, path, body string) {
	t.Helper()
	if err := os.WriteFile(path+".tmp", []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(path+".tmp", path); err != nil {
		t.Fatal(err)
	}
}

// An edit made after the policy was loaded and before the node finished
// starting (and armed its watcher) is applied: the node compares the
// files with what it loaded once the watch is in place.
func TestEditWhileStartingIsApplied(t *testing.T) {
	path := filepath.Join(t.TempDir(), "policy.yaml")
	listen := freeAddr(t)
	writeRunPolicy(t, path, listen, "127.0.0.1:9", "250ms", "10/s")
	pol, err := admission.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	writeRunPolicy(t, path, listen, "127.0.0.1:9", "250ms", "20/s")
	rt := startLoaded(t, pol, path, true)
	for deadline := time.Now().Add(10 * time.Second); ; {
		rt.mu.Lock()
		rate := rt.pol.Zones[0].Rate
		rt.mu.Unlock()
		if rate == 20 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("rate %d in force 10s after start, want the edited 20", rate)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
