package h2proxy_test

import (
	"encoding/xml"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/rl-tproxy/rl-tproxy/internal/testkit"
	"github.com/rl-tproxy/rl-tproxy/pkg/exchange"
)

// H2specVersion is the h2spec release the conformance test builds (Go
// module github.com/summerwind/h2spec, through the module proxy).
const H2specVersion = "v2.2.1+incompatible"

// h2specExceptions are the h2spec cases allowed to fail, each with its
// reason (docs/http.md lists them too), keyed by "package/section case".
var h2specExceptions = map[string]string{
	"http2/3.5 Sends invalid connection preface": "a service port serves HTTP/1.1 and HTTP/2 alike: bytes that " +
		"are not the HTTP/2 preface are an HTTP/1.1 request to the proxy's dispatch, answered 400 and closed " +
		"(an HTTP/2-only port closes without a reply: TestBadPrefaceClosesCleanly)",
}

// buildH2spec installs h2spec into a temporary directory with the go
// command running this test.
func buildH2spec(t *testing.T) string {
	t.Helper()
	goBin, err := exec.LookPath("go")
	if err != nil {
		testkit.Missing(t, "the go command on PATH (to build h2spec %s)", H2specVersion)
	}
	dir := t.TempDir()
	cmd := exec.Command(goBin, "install", "github.com/summerwind/h2spec/cmd/h2spec@"+H2specVersion)
	cmd.Env = append(os.Environ(), "GOBIN="+dir, "GOFLAGS=")
	if out, err := cmd.CombinedOutput(); err != nil {
		testkit.Missing(t, "h2spec %s (go install through the module proxy): %v\n%s", H2specVersion, err, out)
	}
	return filepath.Join(dir, "h2spec")
}

type junit struct {
	Suites []struct {
		Name  string `xml:"name,attr"`
		Cases []struct {
			Package string    `xml:"package,attr"`
			Class   string    `xml:"classname,attr"`
			Failure *struct{} `xml:"failure"`
			Error   *struct{} `xml:"error"`
			Skipped *struct{} `xml:"skipped"`
		} `xml:"testcase"`
	} `xml:"testsuite"`
}

// TestH2spec runs every h2spec case (generic, http2 and hpack, strict
// ones included) against a proxy listener (pkg/proxy dispatching to
// h2proxy) in front of an HTTP/2 upstream.
// Every case must pass except the listed exceptions.
func TestH2spec(t *testing.T) {
	bin := buildH2spec(t)
	upLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var p http.Protocols
	p.SetUnencryptedHTTP2(true)
	us := &http.Server{Protocols: &p, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		_, _ = io.WriteString(w, "hello from the upstream\n") // h2spec 6.9.2 needs a body of 5+ bytes
	})}
	go func() { _ = us.Serve(upLn) }()
	defer us.Close()
	_, addr := startListenerProxy(t, &exchange.Service{Name: "spec", Upstream: upLn.Addr().String()}, &rec{})
	_, port, _ := net.SplitHostPort(addr)
	report := filepath.Join(t.TempDir(), "h2spec.xml")
	cmd := exec.Command(bin, "--strict", "-h", "127.0.0.1", "-p", port, "-o", "5", "-j", report)
	out, runErr := cmd.CombinedOutput()
	if os.Getenv("H2SPEC_VERBOSE") != "" {
		t.Logf("%s", out)
	}
	data, err := os.ReadFile(report)
	if err != nil {
		t.Fatalf("h2spec: %v (%v)\n%s", err, runErr, out)
	}
	var j junit
	if err := xml.Unmarshal(data, &j); err != nil {
		t.Fatalf("h2spec report: %v", err)
	}
	passed, failed, skipped := 0, 0, 0
	for _, s := range j.Suites {
		for _, c := range s.Cases {
			id := c.Package + " " + c.Class
			switch {
			case c.Skipped != nil:
				skipped++
				t.Errorf("skipped: %s (%s)", id, s.Name)
			case c.Failure != nil || c.Error != nil:
				if why, ok := h2specExceptions[id]; ok {
					t.Logf("documented exception %s: %s", id, why)
					continue
				}
				failed++
				t.Errorf("failed: %s (%s)", id, s.Name)
			default:
				passed++
			}
		}
	}
	t.Logf("h2spec %s: %d passed, %d failed, %d skipped", H2specVersion, passed, failed, skipped)
	if passed < 144 {
		t.Errorf("only %d cases ran and passed\n%s", passed, lastLines(string(out), 40))
	}
}

func lastLines(s string, n int) string {
	l := strings.Split(s, "\n")
	if len(l) > n {
		l = l[len(l)-n:]
	}
	return strings.Join(l, "\n")
}
