package e2e

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestStalledLogReader: the real binary with its stderr in a pipe that
// nobody reads (a stuck log collector). Access lines are written by the
// event loops; before internal/asynclog the loops blocked in write(2) once
// the pipe filled (~170 JSON lines) and every request on the node hung,
// SIGTERM included. Now the requests are all answered, the lines that
// did not fit --log-buffer are counted in
// rl_tproxy_log_lines_dropped_total, and once the reader comes back the
// proxy logs again and stops cleanly on SIGTERM.
func TestStalledLogReader(t *testing.T) {
	c := startCluster(t)
	up := startIDUpstream(t)
	dir := t.TempDir()
	o := policyOpts{fail: "open", credentials: writeCredentials(t, dir, c.cred), upstream: up.addr, listen: freeAddr(t)}
	cmd := exec.Command(binPath, "run", "--policy", writePolicy(t, dir, c, o), "--admin", "127.0.0.1:0",
		"--log-format", "json", "--log-buffer", "4096", "--drain-timeout", "5s")
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	// Wait closes the pipe: it runs only once stderr reached EOF.
	waited := false
	t.Cleanup(func() {
		if !waited {
			_ = cmd.Process.Kill()
			io.Copy(io.Discard, stderr)
			_ = cmd.Wait()
		}
	})
	// Read until the admin listener and the service listen, then stop.
	sc := bufio.NewScanner(stderr)
	var admin string
	listening := false
	for (admin == "" || !listening) && sc.Scan() {
		var m map[string]any
		if json.Unmarshal(sc.Bytes(), &m) != nil {
			continue
		}
		switch m["msg"] {
		case "admin listener":
			admin, _ = m["addr"].(string)
		case "listening":
			listening = true
		}
	}
	if admin == "" || !listening {
		t.Fatalf("no admin/listening line before stderr ended: %v", sc.Err())
	}
	waitReadyz(t, admin)

	// 600 access lines of ~400 bytes: well past the pipe (64 KiB) and
	// the log buffer (4 KiB). Each must be answered.
	client := &http.Client{Timeout: 10 * time.Second}
	for i := range 600 {
		resp, err := client.Get("http://" + o.listen + "/probe")
		if err != nil {
			t.Fatalf("request %d with the log reader stalled: %v", i, err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("request %d: status %d", i, resp.StatusCode)
		}
	}
	dropped := scrapeSeries(t, admin, "rl_tproxy_log_lines_dropped_total")
	if dropped <= 0 {
		t.Fatalf("rl_tproxy_log_lines_dropped_total %v after 600 lines into a stalled 64 KiB pipe", dropped)
	}

	// The reader comes back: what was kept arrives, and the proxy stops
	// cleanly, its last lines included.
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(stderr) // to EOF: the process exited
	out := string(b)
	waited = true
	if err := cmd.Wait(); err != nil {
		t.Fatalf("exit after SIGTERM: %v", err)
	}
	if !strings.Contains(out, `"msg":"stopped"`) {
		t.Fatalf("no stop line once the reader came back; read:\n%.2000s", out)
	}
	t.Logf("%v log lines dropped while the reader stalled", dropped)
}

// scrapeSeries returns the value of one series from admin's /metrics.
func scrapeSeries(t *testing.T, admin, series string) float64 {
	t.Helper()
	resp, err := http.Get("http://" + admin + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	for _, l := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(l, series+" "); ok {
			var v float64
			fmt.Sscan(rest, &v)
			return v
		}
	}
	return -1
}
