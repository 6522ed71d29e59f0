package proxy

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/rl-tproxy/rl-tproxy/internal/testkit"
	"github.com/rl-tproxy/rl-tproxy/pkg/exchange"
)

// startNginx runs nginx (foreground, no master) on a free loopback port with
// its own configuration in a temp dir; it returns the address and the dir.
// The access log records the X-Forwarded-For each request arrived with.
func startNginx(t *testing.T) (addr, dir string) {
	t.Helper()
	bin := testkit.NeedTool(t, "nginx", "nginx")
	dir = t.TempDir()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr = ln.Addr().String()
	ln.Close()
	if err := os.MkdirAll(filepath.Join(dir, "www"), 0o755); err != nil {
		t.Fatal(err)
	}
	big := bytes.Repeat([]byte("0123456789abcdef"), 12<<10) // 192 KiB: the splice path
	if err := os.WriteFile(filepath.Join(dir, "www", "big"), big, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "www", "big4m"), spliceBody(4<<20, 9), 0o644); err != nil {
		t.Fatal(err)
	}
	conf := fmt.Sprintf(`daemon off;
master_process off;
error_log %[1]s/error.log warn;
pid %[1]s/nginx.pid;
events { worker_connections 1024; }
http {
    log_format xff '$status "$http_x_forwarded_for" "$request"';
    access_log %[1]s/access.log xff;
    client_body_temp_path %[1]s/tmp_body;
    proxy_temp_path %[1]s/tmp_proxy;
    fastcgi_temp_path %[1]s/tmp_fcgi;
    uwsgi_temp_path %[1]s/tmp_uwsgi;
    scgi_temp_path %[1]s/tmp_scgi;
    keepalive_requests 100000;
    server {
        listen %[2]s;
        root %[1]s/www;
        location = / { return 200 "nginx ok\n"; }
        location = /echo { return 200 "posted\n"; }
        location = /big { }
        location = /big4m { }
    }
}
`, dir, addr)
	cf := filepath.Join(dir, "nginx.conf")
	if err := os.WriteFile(cf, []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "-p", dir, "-c", cf, "-e", filepath.Join(dir, "error.log"))
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-exited
	})
	// Readiness of an external process: bounded polling of its port.
	for i := 0; ; i++ {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			c.Close()
			break
		}
		select {
		case err := <-exited:
			b, _ := os.ReadFile(filepath.Join(dir, "error.log"))
			t.Fatalf("nginx exited: %v\n%s\n%s", err, stderr.String(), b)
		default:
		}
		if i == 500 {
			t.Fatalf("nginx not listening on %s: %v", addr, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	return addr, dir
}

func TestEndToEndNginxCurlWrk(t *testing.T) {
	if testing.Short() {
		t.Skip("short")
	}
	for _, tool := range []string{"curl", "wrk"} {
		testkit.NeedTool(t, tool, tool)
	}
	upstream, dir := startNginx(t)
	hook := newTestHook(nil)
	// Drain Done records until the proxy has shut down (this cleanup is
	// registered first, so it runs after startProxy's).
	stop, drained := make(chan struct{}), make(chan struct{})
	t.Cleanup(func() { close(stop); <-drained })
	go func() {
		defer close(drained)
		for {
			select {
			case <-hook.doneCh:
			case <-stop:
				return
			}
		}
	}()
	svc := &exchange.Service{Name: "nginx", Upstream: upstream, XForwardedFor: true}
	_, addr := startProxy(t, hook, svc, nil)
	url := "http://" + addr

	curl := func(args ...string) string {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		out, err := exec.CommandContext(ctx, "curl", append([]string{"-sS", "--max-time", "10"}, args...)...).CombinedOutput()
		if err != nil {
			t.Fatalf("curl %v: %v\n%s", args, err, out)
		}
		return string(out)
	}
	// Several requests on one keep-alive connection, a POST with a body,
	// a chunked upload, HEAD, and a body large enough for splice.
	if out := curl("-w", " %{http_code}\n", url+"/", url+"/", url+"/"); strings.Count(out, "nginx ok\n 200\n") != 3 {
		t.Fatalf("GET via curl: %q", out)
	}
	if out := curl("-w", " %{http_code}", "--data-binary", "hello", url+"/echo"); out != "posted\n 200" {
		t.Fatalf("POST via curl: %q", out)
	}
	if out := curl("-w", " %{http_code}", "-H", "Transfer-Encoding: chunked", "--data-binary", "chunky", url+"/echo"); out != "posted\n 200" {
		t.Fatalf("chunked POST via curl: %q", out)
	}
	if out := curl("-I", "-o", "/dev/null", "-w", "%{http_code}", url+"/big"); out != "200" {
		t.Fatalf("HEAD via curl: %q", out)
	}
	if out := curl("-o", "/dev/null", "-w", "%{http_code} %{size_download}", url+"/big"); out != fmt.Sprintf("200 %d", 192<<10) {
		t.Fatalf("big GET via curl: %q", out)
	}

	// wrk: bounded load, every response must be a 2xx.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, "wrk", "-t1", "-c8", "-d2s", url+"/").CombinedOutput()
	if err != nil {
		t.Fatalf("wrk: %v\n%s", err, out)
	}
	t.Logf("wrk through the proxy (machine shared, not a benchmark):\n%s", out)
	if bytes.Contains(out, []byte("Non-2xx")) || bytes.Contains(out, []byte("Socket errors")) {
		t.Fatalf("wrk saw errors:\n%s", out)
	}
	m := regexp.MustCompile(`(\d+) requests in`).FindSubmatch(out)
	if m == nil || string(m[1]) == "0" {
		t.Fatalf("wrk made no requests:\n%s", out)
	}

	// nginx's access log: every request arrived with the proxy's
	// X-Forwarded-For and was answered 200.
	logb, err := os.ReadFile(filepath.Join(dir, "access.log"))
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(string(logb)), "\n")
	if len(lines) < 8 {
		t.Fatalf("access log has %d lines", len(lines))
	}
	for _, l := range lines {
		if !strings.HasPrefix(l, `200 "127.0.0.1" "`) {
			t.Fatalf("access log line %q: want status 200 and X-Forwarded-For 127.0.0.1", l)
		}
	}
}

// Large files from a real nginx (sendfile) through the proxy to curl, on
// both loop backends: byte for byte the file, most of it spliced, and the
// upstream connection pooled after each (one keep-alive connection from
// curl for three downloads).
func TestEndToEndNginxCurlSplice(t *testing.T) {
	testkit.NeedTool(t, "curl", "curl")
	eachLoopBackend(t, func(t *testing.T) {
		upstream, dir := startNginx(t)
		p, addr := startProxy(t, nil, &exchange.Service{Name: "nginx", Upstream: upstream}, func(c *Config) { c.EventLoops = 1 })
		out := t.TempDir()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		args := []string{"-sS", "--max-time", "20", "-w", "%{http_code} %{size_download} %{num_connects}\n"}
		for i, path := range []string{"/big4m", "/big", "/big4m"} {
			args = append(args, "-o", filepath.Join(out, fmt.Sprint(i)), "http://"+addr+path)
		}
		res, err := exec.CommandContext(ctx, "curl", args...).CombinedOutput()
		if err != nil {
			t.Fatalf("curl: %v\n%s", err, res)
		}
		if want := fmt.Sprintf("200 %d 1\n200 %d 0\n200 %d 0\n", 4<<20, 192<<10, 4<<20); string(res) != want {
			t.Fatalf("curl: %q, want %q", res, want)
		}
		for i, name := range []string{"big4m", "big", "big4m"} {
			got, err1 := os.ReadFile(filepath.Join(out, fmt.Sprint(i)))
			want, err2 := os.ReadFile(filepath.Join(dir, "www", name))
			if err1 != nil || err2 != nil || !bytes.Equal(got, want) {
				t.Fatalf("download %d (%s) differs from the file (%v, %v)", i, name, err1, err2)
			}
		}
		st := p.Stats()
		if st.Loops.Spliced < 2*(4<<20)-(64<<10) || st.UpstreamDiscarded != 0 || st.UpstreamIdle != 1 {
			t.Fatalf("stats %+v: want most of the bodies spliced, one clean pooled upstream connection", st)
		}
	})
}
