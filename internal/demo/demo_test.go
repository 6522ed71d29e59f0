package demo

import (
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"testing"

	"gopkg.in/yaml.v3"

	"github.com/rl-tproxy/rl-tproxy/pkg/admission"
)

func TestYAMLPath(t *testing.T) {
	var n yaml.Node
	if err := yaml.Unmarshal([]byte("a:\n  b: {c: 3}\nl: [1]\n"), &n); err != nil {
		t.Fatal(err)
	}
	if v := yamlPath(&n, "a", "b", "c"); v == nil || v.Value != "3" {
		t.Fatalf("a.b.c = %v", v)
	}
	for _, keys := range [][]string{{"a", "x"}, {"l", "x"}, {"a", "b", "c", "d"}} {
		if v := yamlPath(&n, keys...); v != nil {
			t.Fatalf("%v found %v", keys, v.Value)
		}
	}
}

// A policy the demo cannot run is ErrInvalid, and nothing is started.
func TestRunRejectsUnsuitablePolicy(t *testing.T) {
	cases := map[string]string{
		"not embedded":     "ratelimitly: {srv: _rl._udp.example.internal, resolver: 127.0.0.1:53, credentials: creds.yaml}\nservices:\n  - name: web\n    listen: 127.0.0.1:9000\n    upstream: 127.0.0.1:9\n",
		"no listener-mode": "ratelimitly: {embedded: true}\nservices:\n  - name: web\n    port: 8080\n    upstream: 127.0.0.1:8080\n",
	}
	for name, body := range cases {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, "policy.yaml")
			creds := "tenant: t\nkey_id: 1\nsecret: AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=\n"
			if err := os.WriteFile(filepath.Join(dir, "creds.yaml"), []byte(creds), 0o600); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
				t.Fatal(err)
			}
			p, err := admission.Load(path)
			if err != nil {
				t.Fatal(err)
			}
			err = Run(Config{Policy: p, PolicyPath: path, NoWait: true, Out: io.Discard, Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("err %v, want ErrInvalid", err)
			}
		})
	}
}
