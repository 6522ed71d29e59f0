package admission

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
)

func TestLoadOfflineWithoutCredentials(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "policy.yaml")
	body := `ratelimitly:
  srv: _rl._udp.example.internal
  credentials: /nonexistent/credentials.yaml
zones:
  z: {bucket: "k:{header.x-key}:{remote_addr}:{query.user}{cookie.sid}{host}", rate: 1/s}
services:
  - name: web
    listen: 127.0.0.1:8080
    upstream: 127.0.0.1:8081
    locations:
      - name: all
        match: {path_prefix: /}
        limit: [z]
`
	if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(path); err == nil {
		t.Fatal("Load read a missing credentials file")
	}
	p, err := LoadOffline(path)
	if err != nil {
		t.Fatal(err)
	}
	got := p.Services[0].Locations[0].Limits[0].Bucket.Variables()
	if want := []string{"header.x-key", "remote_addr", "query.user", "cookie.sid", "host"}; !slices.Equal(got, want) {
		t.Fatalf("variables %q, want %q", got, want)
	}
	if _, err := LoadOffline(filepath.Join(dir, "missing.yaml")); err == nil {
		t.Fatal("missing policy loaded")
	}
	if err := os.WriteFile(path, []byte("zones: [\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadOffline(path); err == nil {
		t.Fatal("invalid policy loaded")
	}
}
