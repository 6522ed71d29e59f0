package fault

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/rl-tproxy/rl-tproxy/internal/testkit"
	"github.com/rl-tproxy/rl-tproxy/internal/testkit/rlcluster"
	"github.com/rl-tproxy/rl-tproxy/pkg/ratelimitly/credentials"
)

// needles are the forms a leaked secret could take in text output.
func needles(c credentials.Credential) map[string]string {
	s := c.Secret[:]
	dec := strings.Trim(fmt.Sprint(s[:8]), "[]") // a %v-printed byte array
	return map[string]string{
		"base64":            base64.StdEncoding.EncodeToString(s),
		"base64 (30 bytes)": base64.StdEncoding.EncodeToString(s[:30]), // a truncated or re-padded echo
		"base64url":         base64.RawURLEncoding.EncodeToString(s),
		"hex":               hex.EncodeToString(s),
		"HEX":               strings.ToUpper(hex.EncodeToString(s)),
		"hex (16 bytes)":    hex.EncodeToString(s[:16]),
		"raw bytes":         string(s),
		"decimal bytes":     "[" + dec,
	}
}

// leaks fails t for every needle found in out.
func leaks(t *testing.T, where, out string, c credentials.Credential) {
	t.Helper()
	if out == "" {
		t.Fatalf("%s: empty output: nothing was checked", where)
	}
	for form, n := range needles(c) {
		if strings.Contains(out, n) {
			i := strings.Index(out, n)
			lo, hi := max(0, i-80), min(len(out), i+len(n)+20)
			t.Errorf("%s: the secret (%s) appears in the output: ...%q...", where, form, out[lo:hi])
		}
	}
}

func get(t *testing.T, url string) string {
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

var serverAdminRE = regexp.MustCompile(`msg=serving .*admin=(\S+)`)

// (f) The secret never appears in logs, metrics or error output: a proxy
// with debug logging (debug level, `debug: true`) serves allowed requests,
// is reloaded with broken credentials files that contain the secret
// (rejected with errors), and another proxy uses a wrong secret for the
// same key id (authentication failures at the servers and the client);
// `rl-tproxy check` and `run` report the broken files; the servers log and
// export metrics. Every output is searched for the secret in base64, hex,
// raw and decimal form.
func TestSecretNeverDisclosed(t *testing.T) {
	c := startCluster(t)
	up := startUpstream(t)
	dir := t.TempDir()
	credPath := filepath.Join(dir, "credentials.yaml")
	writeFile(t, credPath, rlcluster.CredentialYAML(c.cred))
	pol, listen := writePolicy(t, dir, c, policyOpts{fail: "close", unit: "100ms", creds: credPath, debug: true, upstream: up.addr})
	p := startProxy(t, pol, listen, "debug", true)
	if st := load(t, p.base+"/api", 30, 3, nil); st[200] != 30 {
		t.Fatalf("statuses %v", st)
	}
	if st := load(t, p.base+"/open", 5, 1, nil); st[200] != 5 {
		t.Fatalf("statuses %v", st)
	}

	// Broken credentials files that carry the real secret: an unknown key,
	// a bad key_id, the secret under a misspelt field, a secret one byte
	// short. Each is loaded by a reload (SIGHUP), by `check` and by `run`.
	b64 := base64.StdEncoding.EncodeToString(c.cred.Secret[:])
	broken := []string{
		rlcluster.CredentialYAML(c.cred) + "extra: 1\n",
		fmt.Sprintf("tenant: fault\nkey_id: -3\nsecret: %s\n", b64),
		fmt.Sprintf("tenant: fault\nkey_id: 21\nsecert: %s\n", b64),
		fmt.Sprintf("tenant: fault\nkey_id: 21\nsecret: %s\n", base64.StdEncoding.EncodeToString(c.cred.Secret[:31])),
		fmt.Sprintf("tenant: fault\nkey_id: 21\nsecret: %s!\n", b64),
		fmt.Sprintf("credentials:\n  - {tenant: fault, key_id: 21, secret: %s}\n  - {tenant: fault, key_id: 21, secret: %s}\n", b64, b64),
	}
	var cliOut bytes.Buffer
	errorsBefore := p.metric("rl_tproxy_policy_reload_errors_total")
	for i, body := range broken {
		writeFile(t, credPath, body)
		if err := p.cmd.Process.Signal(syscall.SIGHUP); err != nil {
			t.Fatal(err)
		}
		testkit.WaitWithin(t, 30*time.Second, fmt.Sprintf("reload %d rejected", i), func() bool {
			return p.metric("rl_tproxy_policy_reload_errors_total") > errorsBefore
		})
		errorsBefore = p.metric("rl_tproxy_policy_reload_errors_total")
		for _, args := range [][]string{{"check", "--policy", pol}, {"run", "--policy", pol, "--admin", "off"}} {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			cmd := exec.CommandContext(ctx, binPath, args...)
			var out bytes.Buffer
			cmd.Stdout, cmd.Stderr = &out, &out
			err := cmd.Run()
			cancel()
			if err == nil {
				t.Fatalf("rl-tproxy %s accepted broken credentials file %d:\n%s", args[0], i, out.String())
			}
			if !strings.Contains(out.String(), "credentials.yaml") {
				t.Fatalf("rl-tproxy %s on broken credentials %d: the error does not name the file:\n%s", args[0], i, out.String())
			}
			fmt.Fprintf(&cliOut, "$ rl-tproxy %s (credentials %d)\n%s", strings.Join(args, " "), i, out.String())
		}
	}
	writeFile(t, credPath, rlcluster.CredentialYAML(c.cred))

	// A second proxy with the right key id and a wrong secret: every
	// datagram fails authentication at the servers.
	wrong := newCredential(t, c.cred.KeyID)
	dir2 := t.TempDir()
	wrongPath := writeFile(t, filepath.Join(dir2, "credentials.yaml"), rlcluster.CredentialYAML(wrong))
	pol2, listen2 := writePolicy(t, dir2, c, policyOpts{fail: "close", unit: "50ms", creds: wrongPath, debug: true, upstream: up.addr})
	p2 := startProxy(t, pol2, listen2, "debug", true)
	if st := load(t, p2.base+"/api", 10, 2, nil); st[429] != 10 {
		t.Fatalf("wrong secret: statuses %v, want 10 × 429 (fail close)", st)
	}

	metrics := p.scrape() + get(t, "http://"+p.admin+"/readyz") + get(t, "http://"+p.admin+"/healthz")
	metrics2 := p2.scrape()
	var serverOut, serverMetrics strings.Builder
	for _, n := range c.nodes {
		serverMetrics.WriteString(get(t, "http://"+n.p.find(serverAdminRE)+"/metrics"))
	}
	for _, q := range []*proxyProc{p, p2} {
		q.stop()
	}
	for _, n := range c.nodes {
		n.p.stop()
		serverOut.WriteString(strings.Join(n.p.lines(), "\n"))
	}
	proxyLog := strings.Join(p.lines(), "\n")
	if !strings.Contains(proxyLog, `"level":"DEBUG"`) {
		t.Fatal("no DEBUG line in the proxy log: debug logging was not on")
	}
	if !strings.Contains(proxyLog, "credentials.yaml") || !strings.Contains(proxyLog, `"msg":"access"`) {
		t.Fatal("the proxy log lacks the reload errors or the access lines")
	}
	if !strings.Contains(serverMetrics.String(), "auth") {
		t.Fatal("server metrics show no authentication drops from the wrong-secret proxy")
	}
	leaks(t, "proxy log (debug, reload errors)", proxyLog, c.cred)
	leaks(t, "proxy metrics, /readyz, /healthz", metrics, c.cred)
	leaks(t, "check/run error output", cliOut.String(), c.cred)
	leaks(t, "ratelimitly-server logs", serverOut.String(), c.cred)
	leaks(t, "ratelimitly-server metrics", serverMetrics.String(), c.cred)
	wrongLog := strings.Join(p2.lines(), "\n")
	leaks(t, "wrong-secret proxy log", wrongLog, wrong)
	leaks(t, "wrong-secret proxy log", wrongLog, c.cred)
	leaks(t, "wrong-secret proxy metrics", metrics2, wrong)
	leaks(t, "ratelimitly-server logs", serverOut.String(), wrong)
	t.Logf("searched %d proxy log lines, %d B of metrics, %d B of check/run errors, %d B of server logs: no secret",
		len(p.lines())+len(p2.lines()), len(metrics)+len(metrics2)+serverMetrics.Len(), cliOut.Len(), serverOut.Len())
}
