package e2e

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// The released binary in front of an upstream that misbehaves and of
// clients that try to confuse it, in listener mode.
func TestSafeInFrontOfAnyUpstream(t *testing.T) {
	up := strayUpstream(t)
	listen := freeAddr(t)
	policy := filepath.Join(t.TempDir(), "policy.yaml")
	body := "ratelimitly:\n  embedded: true\n  fail: open\n  invalid: deny\n" +
		"zones:\n  key: {bucket: \"{header.x-key}\", rate: 100000/s}\n" +
		"services:\n  - name: web\n    listen: " + listen + "\n    upstream: " + up + "\n" +
		"    timeouts: {header: 300ms}\n    locations:\n      - name: keyed\n        match: {path_prefix: /keyed}\n        limit: [key]\n" +
		"      - name: all\n"
	if err := os.WriteFile(policy, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	p := startProxy(t, policy, true)

	t.Run("no response reaches the wrong client", func(t *testing.T) {
		const clients, each = 8, 300
		var wg sync.WaitGroup
		errs := make(chan error, clients)
		for k := 0; k < clients; k++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				errs <- idClient(listen, k, each)
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			if err != nil {
				t.Error(err)
			}
		}
	})
	t.Run("one host for admission and upstream", func(t *testing.T) {
		for _, tc := range []struct{ req, host string }{
			{"GET /echo HTTP/1.1\r\nHost: api.example\r\nConnection: host, close\r\n\r\n", "api.example"},
			{"GET http://unprotected.example/echo HTTP/1.1\r\nHost: api.example\r\n\r\n", "unprotected.example"},
		} {
			head := rawExchange(t, listen, tc.req)
			if got := strings.Count(strings.ToLower(head), "\r\nhost: "); got != 1 || !strings.Contains(head, "\r\nHost: "+tc.host+"\r\n") {
				t.Fatalf("upstream got %q, want exactly Host: %s", head, tc.host)
			}
		}
	})
	t.Run("invalid key denied under fail open", func(t *testing.T) {
		if head := rawExchange(t, listen, "GET /keyed HTTP/1.1\r\nHost: x\r\nX-Key: alice\r\n\r\n"); !strings.HasPrefix(head, "HTTP/1.1 200 ") {
			t.Fatalf("valid key: %.80q, want 200", head)
		}
		for _, key := range []string{"", strings.Repeat("k", 1100)} {
			hdr := ""
			if key != "" {
				hdr = "X-Key: " + key + "\r\n"
			}
			if head := rawExchange(t, listen, "GET /keyed HTTP/1.1\r\nHost: x\r\n"+hdr+"\r\n"); !strings.HasPrefix(head, "HTTP/1.1 429 ") {
				t.Fatalf("key of %d bytes: %.80q, want 429", len(key), head)
			}
		}
	})
	t.Run("rejections counted and logged", func(t *testing.T) {
		rawExchange(t, listen, "GET / HTTP/1.1\r\n\r\n")        // 400 host-missing
		rawExchange(t, listen, "GET / HTTP/1.1\r\nHost: x\r\n") // 408 after 300ms
		if v := p.metric(`rl_tproxy_rejections_total{reason="host-missing",status="400"}`); v != 1 {
			t.Fatalf("400 rejections %v", v)
		}
		if v := p.metric(`rl_tproxy_rejections_total{reason="header-timeout",status="408"}`); v != 1 {
			t.Fatalf("408 rejections %v", v)
		}
		found := false
		for _, m := range p.snapshot() {
			found = found || m["msg"] == "request rejected by the proxy" && m["reason"] == "host-missing"
		}
		if !found {
			t.Fatal("no log line for the rejection")
		}
	})
}

// strayUpstream answers GET /id/ID with X-Id and body ID, every third
// response followed (in the same write) by a stray second response; GET
// /echo answers with the request head it received.
func strayUpstream(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				br := bufio.NewReader(c)
				for n := 0; ; n++ {
					head, err := readHead(br)
					if err != nil {
						return
					}
					line, _, _ := strings.Cut(head, "\r\n")
					f := strings.Fields(line)
					var out string
					switch {
					case len(f) > 1 && strings.HasPrefix(f[1], "/id/"):
						id := strings.TrimPrefix(f[1], "/id/")
						out = fmt.Sprintf("HTTP/1.1 200 OK\r\nX-Id: %s\r\nContent-Length: %d\r\n\r\n%s", id, len(id), id)
						if n%3 == 2 {
							out += "HTTP/1.1 200 OK\r\nX-Injected: 1\r\nContent-Length: 20\r\n\r\nSTRAY-RESPONSE-BYTES"
						}
					default:
						out = "HTTP/1.1 200 OK\r\nContent-Length: " + strconv.Itoa(len(head)) + "\r\n\r\n" + head
					}
					if _, err := io.WriteString(c, out); err != nil {
						return
					}
				}
			}()
		}
	}()
	return ln.Addr().String()
}

func readHead(br *bufio.Reader) (string, error) {
	var sb strings.Builder
	for {
		l, err := br.ReadString('\n')
		sb.WriteString(l)
		if err != nil {
			return "", err
		}
		if l == "\r\n" {
			return sb.String(), nil
		}
	}
}

// idClient sends n requests with their own ids on one connection and
// checks every response carries its id and nothing follows the last one.
func idClient(addr string, k, n int) error {
	c, err := net.Dial("tcp", addr)
	if err != nil {
		return err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(time.Minute))
	br := bufio.NewReader(c)
	for i := 0; i < n; i++ {
		id := fmt.Sprintf("c%d-%d", k, i)
		conn := ""
		if i == n-1 {
			conn = "Connection: close\r\n"
		}
		fmt.Fprintf(c, "GET /id/%s HTTP/1.1\r\nHost: x\r\n%s\r\n", id, conn)
		head, err := readHead(br)
		if err != nil {
			return fmt.Errorf("client %d request %s: %w", k, id, err)
		}
		if !strings.Contains(head, "\r\nX-Id: "+id+"\r\n") || strings.Contains(head, "X-Injected") {
			return fmt.Errorf("client %d request %s got another exchange's response: %q", k, id, head)
		}
		b := make([]byte, len(id))
		if _, err := io.ReadFull(br, b); err != nil || string(b) != id {
			return fmt.Errorf("client %d request %s: body %q %v", k, id, b, err)
		}
	}
	if rest, _ := io.ReadAll(br); len(rest) != 0 {
		return fmt.Errorf("client %d: %d stray bytes after its last response: %.60q", k, len(rest), rest)
	}
	return nil
}

// rawExchange sends req on a new connection and returns everything the
// proxy sent back until it closed or 2s passed.
func rawExchange(t *testing.T, addr, req string) string {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if !strings.Contains(req, "Connection:") && strings.HasSuffix(req, "\r\n\r\n") {
		req = strings.TrimSuffix(req, "\r\n") + "Connection: close\r\n\r\n"
	}
	io.WriteString(c, req)
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	b, _ := io.ReadAll(c)
	return string(b)
}
