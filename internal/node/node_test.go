package node

import (
	"context"
	"fmt"
	"github.com/rl-tproxy/rl-tproxy/internal/testkit"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/rl-tproxy/rl-tproxy/pkg/admission"
)

func freeAddr(t *testing.T) string {
	t.Helper()
	return testkit.FreeAddr(t)
}

func writeRunPolicy(t *testing.T, path, listen, upstream, unit, rate string) {
	t.Helper()
	body := fmt.Sprintf(`ratelimitly:
  embedded: true
  request_policy: {name: standard, unit: %s}
  fail: close
zones:
  z: {bucket: "all", rate: %s}
services:
  - name: web
    listen: %s
    upstream: %s
    locations:
      - name: all
        limit: [z]
`, unit, rate, listen, upstream)
	if err := os.WriteFile(path+".tmp", []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(path+".tmp", path); err != nil {
		t.Fatal(err)
	}
}

// With an embedded server and a generated key, a reload that only changes
// limits keeps the client (and the key the server knows); a reload that
// changes the request policy rebuilds the client, which keeps deciding.
func TestReloadKeepsOrRebuildsClient(t *testing.T) {
	up := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok\n") })}
	uln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go up.Serve(uln)
	defer up.Close()
	dir := t.TempDir()
	path := filepath.Join(dir, "policy.yaml")
	listen := freeAddr(t)
	writeRunPolicy(t, path, listen, uln.Addr().String(), "250ms", "1000/s")
	pol, err := admission.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	rt, err := Start(context.Background(), pol, Options{Policy: path, Admin: "off", Log: log})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := rt.Shutdown(ctx); err != nil {
			t.Error(err)
		}
	}()
	for deadline := time.Now().Add(10 * time.Second); !rt.client.C.Ready(); {
		if time.Now().After(deadline) {
			t.Fatal("no discovery")
		}
		time.Sleep(5 * time.Millisecond)
	}
	get := func() int {
		resp, err := http.Get("http://" + listen + "/x")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if s := get(); s != 200 {
		t.Fatalf("status %d", s)
	}
	emb, client := rt.emb, rt.client
	writeRunPolicy(t, path, listen, uln.Addr().String(), "250ms", "2000/s")
	if err := rt.reloader.Reload(admission.TriggerSignal); err != nil {
		t.Fatal(err)
	}
	if rt.emb != emb || rt.client != client {
		t.Fatal("a limits-only reload replaced the client or the embedded server")
	}
	if s := get(); s != 200 {
		t.Fatalf("after limits reload: %d", s)
	}
	writeRunPolicy(t, path, listen, uln.Addr().String(), "300ms", "2000/s")
	if err := rt.reloader.Reload(admission.TriggerSignal); err != nil {
		t.Fatal(err)
	}
	if rt.client == client {
		t.Fatal("a request-policy change did not rebuild the client")
	}
	if rt.emb != emb {
		t.Fatal("the embedded server (and its generated key) was replaced")
	}
	if s := get(); s != 200 {
		t.Fatalf("after client rebuild: %d (fail: close answers 429 without a decision)", s)
	}
	// The replaced client leaves the event loops once it is closed: the
	// proxy holds the embedded server and the new client only.
	testkit.WaitFor(t, "the replaced client detached from the loops", func() bool { return rt.proxy.Stats().Attached == 2 })
}
