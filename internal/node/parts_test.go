package node

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/rl-tproxy/rl-tproxy/pkg/admission"
)

func parsePolicy(t *testing.T, body string) *admission.Policy {
	t.Helper()
	p, err := admission.Parse(filepath.Join(t.TempDir(), "policy.yaml"), []byte(body))
	if err != nil {
		t.Fatal(err)
	}
	return p
}

const steeredPolicy = `ratelimitly: {embedded: true}
services:
  - name: a
    port: 8080
    prefixes: [10.0.0.0/8]
    upstream: 127.0.0.1:8080
  - name: b
    port: 80
    upstream: 127.0.0.1:80
  - name: c
    listen: 127.0.0.1:9000
    upstream: 127.0.0.1:9001
`

func TestSteeredPortsAndRedirectConfig(t *testing.T) {
	p := parsePolicy(t, steeredPolicy)
	if got := steeredPorts(p); !slices.Equal(got, []uint16{80, 8080}) {
		t.Fatalf("steeredPorts = %v", got)
	}
	cfg := redirectConfig(p)
	if !slices.Equal(cfg.Ports, []uint16{80, 8080}) {
		t.Fatalf("ports %v", cfg.Ports)
	}
	if cfg.Prefixes != nil {
		t.Fatalf("a service without prefixes steers every destination, got prefixes %v", cfg.Prefixes)
	}
	if want := wantListeners(p); len(want) != 1 || want["127.0.0.1:9000"] != "c" {
		t.Fatalf("wantListeners = %v", want)
	}
	if steeredPorts(parsePolicy(t, writeListenerPolicy("127.0.0.1:9000"))) != nil {
		t.Fatal("a listener-mode policy has steered ports")
	}
}

func writeListenerPolicy(listen string) string {
	return "ratelimitly: {embedded: true}\nservices:\n  - name: web\n    listen: " + listen + "\n    upstream: 127.0.0.1:9\n"
}

// The client key changes with whatever needs a new client, and not with
// limits; a generated embedded key never enters it.
func TestClientConfigKey(t *testing.T) {
	base := parsePolicy(t, "ratelimitly:\n  embedded: true\n  request_policy: {name: standard, unit: 20ms}\nzones:\n  z: {bucket: all, rate: 5/s}\nservices:\n  - name: web\n    listen: 127.0.0.1:9000\n    upstream: 127.0.0.1:9\n")
	limits := parsePolicy(t, "ratelimitly:\n  embedded: true\n  request_policy: {name: standard, unit: 20ms}\nzones:\n  z: {bucket: all, rate: 50/s}\nservices:\n  - name: web\n    listen: 127.0.0.1:9000\n    upstream: 127.0.0.1:9\n")
	unit := parsePolicy(t, "ratelimitly:\n  embedded: true\n  request_policy: {name: standard, unit: 30ms}\nzones:\n  z: {bucket: all, rate: 5/s}\nservices:\n  - name: web\n    listen: 127.0.0.1:9000\n    upstream: 127.0.0.1:9\n")
	c1, e1 := clientConfigKey(&base.RateLimitly)
	c2, e2 := clientConfigKey(&limits.RateLimitly)
	c3, e3 := clientConfigKey(&unit.RateLimitly)
	if c1 != c2 || e1 != e2 {
		t.Fatal("a limits-only change changed the client key")
	}
	if c1 == c3 {
		t.Fatal("a request-policy change kept the client key")
	}
	if e1 != e3 || e1 == "" {
		t.Fatalf("embedded key %q vs %q: the server does not depend on the request policy", e1, e3)
	}
	if strings.Contains(c1, fmt.Sprintf("%x", base.RateLimitly.Credential.Secret[:])) {
		t.Fatal("the client key holds the secret in clear")
	}
}

func TestNewLogger(t *testing.T) {
	for _, tc := range []struct {
		format, level string
		ok            bool
	}{{"text", "info", true}, {"json", "debug", true}, {"json", "warning", true}, {"xml", "info", false}, {"text", "loud", false}} {
		var b bytes.Buffer
		log, err := NewLogger(tc.format, tc.level, &b)
		if (err == nil) != tc.ok {
			t.Fatalf("%s/%s: err %v", tc.format, tc.level, err)
		}
		if err == nil {
			log.Error("x", "k", "v")
			if tc.format == "json" && !strings.HasPrefix(b.String(), "{") {
				t.Fatalf("json logger wrote %q", b.String())
			}
		}
	}
}

// Run serves until its context ends, then drains and returns nil; the
// listener it opened is closed afterwards.
func TestRunStopsOnCancel(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "policy.yaml")
	listen := freeAddr(t)
	writeRunPolicy(t, path, listen, "127.0.0.1:9", "20ms", "100/s")
	pol, err := admission.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	go func() { done <- Run(ctx, pol, Options{Policy: path, Admin: "off", Log: log}, 5*time.Second) }()
	up := false
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline) && !up; {
		if resp, err := http.Get("http://" + listen + "/"); err == nil {
			resp.Body.Close()
			up = true
		} else {
			time.Sleep(10 * time.Millisecond)
		}
	}
	if !up {
		t.Fatal("the node's listener never answered")
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run: %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("Run did not return after cancel")
	}
	if resp, err := http.Get("http://" + listen + "/"); err == nil {
		resp.Body.Close()
		t.Fatal("the listener still answers after Run returned")
	}
}
