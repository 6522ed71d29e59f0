package node

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/rl-tproxy/rl-tproxy/pkg/admission"
)

// waitHTTP polls url (bounded) until it answers at all.
func waitHTTP(t *testing.T, url string) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; {
		resp, err := http.Get(url)
		if err == nil {
			resp.Body.Close()
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s never answered: %v", url, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// SIGTERM ends Run while a reload is stuck reading its files (simulated:
// the reload's load blocks until the test ends), and SIGHUP never runs the
// reload on the signal loop.
func TestTermDuringBlockedReload(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "policy.yaml")
	listen := freeAddr(t)
	writeRunPolicy(t, path, listen, "127.0.0.1:9", "20ms", "100/s")
	pol, err := admission.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	entered, block := make(chan struct{}), make(chan struct{})
	defer close(block)
	var once sync.Once
	opts := Options{Policy: path, Admin: "off", Log: slog.New(slog.NewTextHandler(io.Discard, nil)),
		load: func(p string) (*admission.Policy, error) {
			once.Do(func() { close(entered) })
			<-block
			return admission.Load(p)
		}}
	done := make(chan error, 1)
	go func() { done <- Run(context.Background(), pol, opts, 5*time.Second) }()
	waitHTTP(t, "http://"+listen+"/")
	if err := syscall.Kill(os.Getpid(), syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	select {
	case <-entered:
	case <-time.After(10 * time.Second):
		t.Fatal("SIGHUP started no reload")
	}
	if err := syscall.Kill(os.Getpid(), syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run: %v", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("SIGTERM not honoured while a reload was blocked")
	}
	select {
	case <-block:
		t.Fatal("the reload was released before Run returned: the test proves nothing")
	default:
	}
}

// silentResolver is a DNS server that receives queries and never answers.
func silentResolver(t *testing.T) (addr string, queried <-chan struct{}) {
	t.Helper()
	c, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	q := make(chan struct{})
	go func() {
		buf := make([]byte, 1500)
		if _, _, err := c.ReadFrom(buf); err == nil {
			close(q)
		}
	}()
	return c.LocalAddr().String(), q
}

// /healthz and /readyz answer while a reload holds the runtime lock
// waiting for a new client's discovery through a resolver that never
// answers; readiness is the last completed state. The test gets both
// answers, checks the reload is still waiting, and only then releases it
// (by shutting the node down, which ends the wait).
func TestHealthAnswersWhileReloadWaitsOnResolver(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "policy.yaml")
	listen := freeAddr(t)
	writeRunPolicy(t, path, listen, "127.0.0.1:9", "20ms", "100/s")
	pol, err := admission.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	n, err := Start(context.Background(), pol, Options{Policy: path, Admin: "127.0.0.1:0", Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	shut := sync.OnceFunc(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = n.Shutdown(ctx)
	})
	defer shut()
	admin := "http://" + n.AdminAddr().String()
	for deadline := time.Now().Add(10 * time.Second); ; {
		if _, ok := n.Ready(); ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("never ready")
		}
		time.Sleep(10 * time.Millisecond)
	}
	resolver, queried := silentResolver(t)
	if err := os.WriteFile(filepath.Join(dir, "creds.yaml"), []byte("tenant: t\nkey_id: 1\nsecret: AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	body := fmt.Sprintf("ratelimitly:\n  srv: _rl._udp.unreachable.test\n  resolver: %s\n  resolver_timeout: 30s\n  credentials: creds.yaml\n  fail: close\nservices:\n  - name: web\n    listen: %s\n    upstream: 127.0.0.1:9\n", resolver, listen)
	if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	reloaded := make(chan error, 1)
	go func() { reloaded <- n.Reload(admission.TriggerSignal) }()
	select {
	case <-queried: // the new client is discovering: the reload waits for it
	case <-time.After(10 * time.Second):
		t.Fatal("the reload's client never queried the resolver")
	}
	hc := &http.Client{Timeout: 20 * time.Second} // a bound, far below the reload's 61s wait
	for _, p := range []string{"/healthz", "/readyz"} {
		resp, err := hc.Get(admin + p)
		if err != nil {
			t.Fatalf("%s: %v", p, err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("%s: %d %q during the reload; want 200 (the last completed state)", p, resp.StatusCode, b)
		}
		if p == "/readyz" && !strings.Contains(string(b), "ok ratelimitly") {
			t.Fatalf("/readyz body %q", b)
		}
	}
	select {
	case err := <-reloaded:
		t.Fatalf("the reload finished (%v) before the answers were checked: the test proves nothing", err)
	default:
	}
	shut() // release: shutdown ends the discovery wait
	select {
	case err := <-reloaded:
		if err == nil || !errors.Is(err, context.Canceled) && !strings.Contains(err.Error(), "shutting down") && !strings.Contains(err.Error(), "abandoned") {
			t.Fatalf("reload after release: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the reload did not end after shutdown")
	}
}
