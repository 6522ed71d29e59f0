package e2e

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rl-tproxy/rl-tproxy/internal/testkit"
)

// Behind a balancer: a zone keyed on {remote_addr} with burst 2, and
// client_address trusting X-Forwarded-For from 127.0.0.1 only. The
// client the header names is limited, not the balancer; a spoofed left
// part of the list does not move the key; a peer outside trusted is
// keyed by its own address whatever it sends. HTTP/1.1 and HTTP/2 alike.
func TestClientAddressBehindBalancer(t *testing.T) {
	e := newEnv(t, nil, policyOpts{
		defaults: "defaults:\n  client_address: {from: x-forwarded-for, trusted: [127.0.0.1/32]}\n  upstream_protocol: http1\n",
		zones:    "  per_client: {bucket: \"c:{remote_addr}\", rate: 1/m, burst: 2}\n",
		extra:    "      - name: realip\n        match: {path_prefix: /realip}\n        limit: [per_client]\n",
	})
	testkit.NeedTool(t, "curl", "curl")
	step := func(name string, want int, args ...string) {
		t.Helper()
		// The status alone (curl -w): curl writes HTTP/2 heads as
		// "HTTP/2 200", which net/http's response reader refuses.
		full := append([]string{"-s", "-S", "--max-time", "10", "-o", "/dev/null", "-w", "%{http_code}"}, args...)
		out, err := exec.Command("curl", append(full, e.p.base+"/realip")...).Output()
		if err != nil {
			t.Fatalf("%s: curl: %v", name, err)
		}
		if got, _ := strconv.Atoi(strings.TrimSpace(string(out))); got != want {
			t.Fatalf("%s: status %s, want %d", name, out, want)
		}
	}
	step("first from .7", 200, "-H", "X-Forwarded-For: 203.0.113.7")
	step("second from .7", 200, "-H", "X-Forwarded-For: 203.0.113.7")
	step("third from .7", 429, "-H", "X-Forwarded-For: 203.0.113.7")
	step("spoofed left part, still .7", 429, "-H", "X-Forwarded-For: 198.51.100.9, 203.0.113.7")
	step("another client", 200, "-H", "X-Forwarded-For: 203.0.113.8")
	l := e.p.waitAccess(5)
	if l["remote"] != "203.0.113.8:0" {
		t.Errorf("access line remote %v, want the forwarded client 203.0.113.8:0", l["remote"])
	}
	if peer, _ := l["peer"].(string); len(peer) < len("127.0.0.1:") || peer[:len("127.0.0.1:")] != "127.0.0.1:" {
		t.Errorf("access line peer %v, want the balancer 127.0.0.1:port", l["peer"])
	}

	// HTTP/2 (prior knowledge, the same port): the same resolution.
	h2 := []string{"--http2-prior-knowledge", "-H", "X-Forwarded-For: 203.0.113.9"}
	step("h2 first from .9", 200, h2...)
	step("h2 second from .9", 200, h2...)
	step("h2 third from .9", 429, h2...)
	if l := e.p.waitAccess(8); l["proto"] != "h2" || l["remote"] != "203.0.113.9:0" {
		t.Errorf("HTTP/2 deny's line: proto %v remote %v, want h2 and 203.0.113.9:0", l["proto"], l["remote"])
	}

	// A peer outside trusted (127.0.0.2): its header is not believed, so
	// it is keyed by its own address, however many clients it claims.
	for i, xff := range []string{"203.0.113.20", "203.0.113.21", "203.0.113.22"} {
		want := 200
		if i == 2 {
			want = 429
		}
		step("untrusted peer, claims "+xff, want, "--interface", "127.0.0.2", "-H", "X-Forwarded-For: "+xff)
	}
	l = e.p.waitAccess(11)
	if l["remote"] == nil || l["remote"].(string)[:len("127.0.0.2:")] != "127.0.0.2:" || l["remote"] != l["peer"] {
		t.Errorf("untrusted peer's line: remote %v peer %v, want both its own address", l["remote"], l["peer"])
	}
}

// Behind a balancer that speaks the PROXY protocol: 127.0.0.1 is
// trusted and must send a header, which names the client that is keyed
// and logged (HTTP/1.1 and HTTP/2 on the same port); a PROXY header from
// 127.0.0.2, not trusted, is refused without an answer and counted.
func TestClientAddressProxyProtocol(t *testing.T) {
	e := newEnv(t, nil, policyOpts{
		defaults: "defaults:\n  client_address: {from: proxy_protocol, trusted: [127.0.0.1/32]}\n  upstream_protocol: http1\n",
		zones:    "  per_client: {bucket: \"c:{remote_addr}\", rate: 1/m, burst: 2}\n",
		extra:    "      - name: realip\n        match: {path_prefix: /realip}\n        limit: [per_client]\n",
	})
	addr := strings.TrimPrefix(e.p.base, "http://")
	_, port, _ := net.SplitHostPort(addr)
	dial := func(local, header string) net.Conn {
		t.Helper()
		d := net.Dialer{Timeout: 10 * time.Second, LocalAddr: &net.TCPAddr{IP: net.ParseIP(local)}}
		c, err := d.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		c.SetDeadline(time.Now().Add(20 * time.Second))
		if _, err := io.WriteString(c, header); err != nil {
			t.Fatal(err)
		}
		return c
	}
	get := func(name string, want int) {
		t.Helper()
		c := dial("127.0.0.1", "PROXY TCP4 192.0.2.44 127.0.0.1 5555 "+port+"\r\n")
		io.WriteString(c, "GET /realip HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		resp.Body.Close()
		if resp.StatusCode != want {
			t.Fatalf("%s: status %d, want %d", name, resp.StatusCode, want)
		}
	}
	get("first from 192.0.2.44", 200)
	get("second from 192.0.2.44", 200)
	get("third from 192.0.2.44", 429)
	l := e.p.waitAccess(3)
	if l["remote"] != "192.0.2.44:5555" || !strings.HasPrefix(fmt.Sprint(l["peer"]), "127.0.0.1:") {
		t.Errorf("access line remote %v peer %v, want 192.0.2.44:5555 and the balancer 127.0.0.1", l["remote"], l["peer"])
	}

	// HTTP/2 prior knowledge behind the header: another client, its own
	// bucket, keyed by the header's address.
	tr := &http.Transport{DialContext: func(context.Context, string, string) (net.Conn, error) {
		return dial("127.0.0.1", "PROXY TCP4 192.0.2.45 127.0.0.1 6666 "+port+"\r\n"), nil
	}}
	tr.Protocols = new(http.Protocols)
	tr.Protocols.SetUnencryptedHTTP2(true)
	defer tr.CloseIdleConnections()
	hc := &http.Client{Transport: tr, Timeout: 20 * time.Second}
	for i, want := range []int{200, 200, 429} {
		resp, err := hc.Get(e.p.base + "/realip")
		if err != nil {
			t.Fatalf("h2 request %d: %v", i, err)
		}
		resp.Body.Close()
		if resp.StatusCode != want || resp.ProtoMajor != 2 {
			t.Fatalf("h2 request %d: %s %d, want HTTP/2 %d", i, resp.Proto, resp.StatusCode, want)
		}
	}
	if l := e.p.waitAccess(6); l["proto"] != "h2" || l["remote"] != "192.0.2.45:6666" {
		t.Errorf("h2 line: proto %v remote %v, want h2 and 192.0.2.45:6666", l["proto"], l["remote"])
	}

	// An untrusted peer claiming a client: closed without an answer.
	c := dial("127.0.0.2", "PROXY TCP4 192.0.2.99 127.0.0.1 7777 "+port+"\r\nGET /realip HTTP/1.1\r\nHost: x\r\n\r\n")
	if b, err := io.ReadAll(c); err != nil || len(b) != 0 {
		t.Fatalf("untrusted PROXY header: read %q, %v; want the connection closed with no answer", b, err)
	}
	testkit.WaitFor(t, "the refusal counted", func() bool {
		return e.p.metric(`rl_tproxy_rejections_total{reason="proxy-header-untrusted",status="0"}`) == 1
	})
	// And the trusted balancer must send one.
	c = dial("127.0.0.1", "GET /realip HTTP/1.1\r\nHost: x\r\n\r\n")
	if b, err := io.ReadAll(c); err != nil || len(b) != 0 {
		t.Fatalf("trusted peer without a header: read %q, %v; want the connection closed", b, err)
	}
}
