package admission

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"
)

func credPolicy(cred string) string {
	return fmt.Sprintf("ratelimitly:\n  embedded: true\n  credentials: %s\n", cred) + `zones:
  z: {bucket: "all", rate: 10/s}
services:
  - name: web
    listen: 127.0.0.1:18080
    upstream: 127.0.0.1:18081
    locations:
      - name: all
        limit: [z]
`
}

// writeAtomic installs body at path by rename, as a Secret update does.
func writeAtomic(t *testing.T, path, body string, mode os.FileMode) {
	t.Helper()
	tmp := filepath.Join(filepath.Dir(path), ".tmp-"+filepath.Base(path))
	if err := os.WriteFile(tmp, []byte(body), mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// After a reload that points ratelimitly.credentials at a file in another
// directory, the watcher follows it: a change of the new file reloads.
func TestWatchFollowsNewCredentialsPath(t *testing.T) {
	root := t.TempDir()
	path := filepath.Join(root, "policy.yaml")
	oldDir, newDir := filepath.Join(root, "old"), filepath.Join(root, "new")
	for _, d := range []string{oldDir, newDir} {
		if err := os.Mkdir(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	cred := func(id int) string { return fmt.Sprintf("tenant: t\nkey_id: %d\nsecret: %s\n", id, ptSecret) }
	oldCred, newCred := filepath.Join(oldDir, "creds.yaml"), filepath.Join(newDir, "creds.yaml")
	writeAtomic(t, oldCred, cred(1), 0o600)
	writeAtomic(t, newCred, cred(2), 0o600)
	writeAtomic(t, path, credPolicy(oldCred), 0o644)
	p, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	keys := make(chan uint32, 16)
	r := &Reloader{Path: path, Settle: 20 * time.Millisecond, MaxWait: time.Minute,
		Apply: func(p *Policy) error { keys <- p.RateLimitly.Credential.KeyID; return nil }}
	r.Mark(p)
	ctx, cancel := context.WithCancel(context.Background())
	ready, done := make(chan struct{}), make(chan error, 1)
	go func() { done <- r.Watch(ctx, oldCred, ready) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	<-ready
	waitKey := func(want uint32) {
		t.Helper()
		deadline := time.After(10 * time.Second)
		for {
			select {
			case k := <-keys:
				if k == want {
					return
				}
			case <-deadline:
				t.Fatalf("key %d never applied within 10s", want)
			}
		}
	}
	writeAtomic(t, path, credPolicy(newCred), 0o644)
	waitKey(2)
	writeAtomic(t, newCred, cred(3), 0o600)
	waitKey(3)
}
