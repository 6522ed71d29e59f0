package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/rl-tproxy/rl-tproxy/internal/testkit"
)

var addrRE = regexp.MustCompile(`\d+\.\d+\.\d+\.\d+:\d+`)

// repeats names what an error line says twice: an address, or a
// ": "-separated part (such as "listen A: listen A: ...").
func repeats(line string) string {
	seen := map[string]bool{}
	for _, a := range addrRE.FindAllString(line, -1) {
		if seen[a] {
			return "address " + a
		}
		seen[a] = true
	}
	seen = map[string]bool{}
	for _, p := range strings.Split(line, ": ") {
		if seen[p] {
			return "part " + p
		}
		seen[p] = true
	}
	return ""
}

func TestRepeatsFindsTheOldListenError(t *testing.T) {
	for line, want := range map[string]bool{
		"service web: listen 127.0.0.1:28191: listen 127.0.0.1:28191: listen tcp 127.0.0.1:28191: bind: address already in use": true,
		"admin listener 127.0.0.1:9901: listen tcp 127.0.0.1:9901: bind: address already in use":                                true,
		"service web: listen tcp 127.0.0.1:28191: bind: address already in use":                                                 false,
		"a: b: a": true,
	} {
		if got := repeats(line) != ""; got != want {
			t.Errorf("repeats(%q) = %v, want %v", line, got, want)
		}
	}
}

// Every start-up failure of run and ratelimitly-server on an address in
// use exits 2 with an error that names the address once and says each
// thing once.
func TestStartErrorsSayItOnce(t *testing.T) {
	busyTCP, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busyTCP.Close()
	busyUDP, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busyUDP.Close()
	free := func() string { return testkit.FreeAddr(t) }
	dir := t.TempDir()
	policy := func(listen string) string {
		p := filepath.Join(dir, fmt.Sprintf("p%d.yaml", len(listen)+len(dir)))
		body := fmt.Sprintf("ratelimitly: {embedded: true}\nservices:\n  - {name: web, listen: %q, upstream: \"127.0.0.1:9\"}\n", listen)
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	creds := writeServerCreds(t, testServerCreds)
	busy := busyTCP.Addr().String()
	for _, c := range []struct {
		name string
		run  func(stderr io.Writer) int
		want string // in the error
	}{
		{"run/listen", func(w io.Writer) int {
			return dispatch([]string{"run", "--policy", policy(busy), "--admin", "127.0.0.1:0", "--log-format", "json"}, io.Discard, w)
		}, "service web: listen tcp " + busy + ": bind: address already in use"},
		{"run/admin", func(w io.Writer) int {
			return dispatch([]string{"run", "--policy", policy(free()), "--admin", busy, "--log-format", "json"}, io.Discard, w)
		}, "admin listener: listen tcp " + busy + ": bind: address already in use"},
		{"server/listen", func(w io.Writer) int {
			return runServerCtx(context.Background(), []string{"--listen", busyUDP.LocalAddr().String(), "--credentials", creds, "--admin", "127.0.0.1:0"}, io.Discard, w, nil)
		}, busyUDP.LocalAddr().String() + ": address already in use"},
		{"server/admin", func(w io.Writer) int {
			return runServerCtx(context.Background(), []string{"--listen", "127.0.0.1:0", "--credentials", creds, "--admin", busy}, io.Discard, w, nil)
		}, "admin listener: listen tcp " + busy + ": bind: address already in use"},
	} {
		t.Run(c.name, func(t *testing.T) {
			var errb testkit.SyncBuffer
			if code := c.run(&errb); code != exitRuntime {
				t.Fatalf("exit %d, want %d: %s", code, exitRuntime, errb.String())
			}
			var line string
			for _, l := range strings.Split(errb.String(), "\n") {
				if strings.Contains(l, "address already in use") {
					line = l
				}
			}
			if !strings.Contains(line, c.want) {
				t.Fatalf("no error line with %q in:\n%s", c.want, errb.String())
			}
			if r := repeats(line); r != "" {
				t.Fatalf("error line repeats its %s: %s", r, line)
			}
		})
	}
}
