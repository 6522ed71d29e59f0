package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

const filesCreds = "tenant: t\nkey_id: 1\nsecret: AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=\n"

func filesPolicy(extra string) string {
	return "ratelimitly:\n  embedded: true\n" + extra + "services:\n  - name: web\n    listen: 127.0.0.1:18999\n    upstream: 127.0.0.1:9\n"
}

// dispatchBounded runs the command line and fails t if it has not
// returned within 20s (it must answer, never block on a file).
func dispatchBounded(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	type res struct {
		code     int
		out, err string
	}
	done := make(chan res, 1)
	go func() {
		var out, errb bytes.Buffer
		c := dispatch(args, &out, &errb)
		done <- res{c, out.String(), errb.String()}
	}()
	select {
	case r := <-done:
		return r.code, r.out, r.err
	case <-time.After(20 * time.Second):
		t.Fatalf("%v blocked", args)
		return 0, "", ""
	}
}

// check and run refuse a FIFO, a directory and /dev/zero as the policy or
// as the credentials file, at once and naming the path.
func TestCheckAndRunRefuseNonRegularFiles(t *testing.T) {
	dir := t.TempDir()
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	cases := []struct{ name, path, want string }{
		{"fifo", fifo, "is a named pipe (FIFO)"},
		{"directory", dir, "is a directory"},
		{"dev-zero", "/dev/zero", "is a character device"},
	}
	for _, tc := range cases {
		credPolicy := filepath.Join(t.TempDir(), "policy.yaml")
		if err := os.WriteFile(credPolicy, []byte(filesPolicy("  credentials: "+tc.path+"\n")), 0o600); err != nil {
			t.Fatal(err)
		}
		for _, verb := range [][]string{{"check"}, {"run", "--admin", "off", "--watch=false"}} {
			for _, which := range []struct{ name, policy string }{{"policy", tc.path}, {"credentials", credPolicy}} {
				t.Run(tc.name+"/"+verb[0]+"/"+which.name, func(t *testing.T) {
					args := append(append([]string{}, verb...), "--policy", which.policy)
					code, _, stderr := dispatchBounded(t, args...)
					if code != exitInvalid || !strings.Contains(stderr, tc.path+" "+tc.want) {
						t.Fatalf("exit %d, stderr %q; want %d and %q", code, stderr, exitInvalid, tc.path+" "+tc.want)
					}
				})
			}
		}
	}
}

// Credentials like ssh keys: writable by group or others is refused,
// world-readable warns.
func TestCheckCredentialsPermissions(t *testing.T) {
	for _, tc := range []struct {
		mode       os.FileMode
		code       int
		wantStderr string
	}{
		{0o600, exitOK, ""},
		{0o644, exitOK, "world-readable"},
		{0o664, exitInvalid, "group- or world-writable"},
		{0o666, exitInvalid, "group- or world-writable"},
	} {
		dir := t.TempDir()
		cred := filepath.Join(dir, "creds.yaml")
		if err := os.WriteFile(cred, []byte(filesCreds), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(cred, tc.mode); err != nil {
			t.Fatal(err)
		}
		policy := filepath.Join(dir, "policy.yaml")
		if err := os.WriteFile(policy, []byte(filesPolicy("  credentials: creds.yaml\n")), 0o600); err != nil {
			t.Fatal(err)
		}
		code, stdout, stderr := dispatchBounded(t, "check", "--policy", policy)
		if code != tc.code || (tc.wantStderr == "") != (stderr == "") || !strings.Contains(stderr, tc.wantStderr) {
			t.Errorf("mode %04o: exit %d stdout %q stderr %q; want exit %d, stderr with %q", tc.mode, code, stdout, stderr, tc.code, tc.wantStderr)
		}
	}
}

// check binds the RateLimitly client's bind address: one the host does
// not have is an error (run would start and retry; check says so first).
func TestCheckTriesBindAddress(t *testing.T) {
	dir := t.TempDir()
	policy := filepath.Join(dir, "policy.yaml")
	// 192.0.2.1 is TEST-NET-1 (RFC 5737): never a local address.
	if err := os.WriteFile(policy, []byte(filesPolicy("  bind: 192.0.2.1\n")), 0o600); err != nil {
		t.Fatal(err)
	}
	code, _, stderr := dispatchBounded(t, "check", "--policy", policy)
	if code != exitInvalid || !strings.Contains(stderr, "ratelimitly.bind 192.0.2.1: cannot bind") {
		t.Fatalf("exit %d stderr %q", code, stderr)
	}
	if err := os.WriteFile(policy, []byte(filesPolicy("  bind: 127.0.0.1\n")), 0o600); err != nil {
		t.Fatal(err)
	}
	if code, _, stderr := dispatchBounded(t, "check", "--policy", policy); code != exitOK {
		t.Fatalf("loopback bind: exit %d stderr %q", code, stderr)
	}
}
