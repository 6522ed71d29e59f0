package e2e

import (
	"bufio"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rl-tproxy/rl-tproxy/internal/bintest"
	"github.com/rl-tproxy/rl-tproxy/internal/testkit"
)

// TLS passthrough behind a balancer that speaks the PROXY protocol: the
// trusted balancer (127.0.0.1) sends `PROXY TCP4 192.0.2.44 ...` and
// then a real client's ClientHello. The SNI admission keys the zone on
// {remote_addr} = 192.0.2.44 (burst 2: two connections relayed to a real
// TLS server, the third reset), and the access line says remote
// 192.0.2.44 and peer 127.0.0.1. A PROXY header from 127.0.0.2, not
// trusted, is refused and counted, and the trusted balancer must send
// one.
func TestClientAddressProxyProtocolTLS(t *testing.T) {
	var hits atomic.Int64
	up := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		fmt.Fprintf(w, "tls %s\n", r.URL.Path)
	}))
	up.StartTLS()
	t.Cleanup(up.Close)
	roots := x509.NewCertPool()
	roots.AddCert(up.Certificate())

	c := startCluster(t)
	dir := t.TempDir()
	listen := freeAddr(t)
	policy := bintest.WriteFile(t, filepath.Join(dir, "policy.yaml"), fmt.Sprintf(`ratelimitly:
  srv: %s
  resolver: %s
  resolver_timeout: 1s
  credentials: %s
  request_policy: {name: standard, unit: 250ms}
  fail: close
zones:
  per_client: {bucket: "c:{remote_addr}", rate: 1/m, burst: 2}
services:
  - name: tls
    listen: %s
    upstream: %s
    tls: passthrough
    opaque: reject
    client_address: {from: proxy_protocol, trusted: [127.0.0.1/32]}
    limit: [per_client]
`, srvName, c.DNS.Addr(), writeCredentials(t, dir, c.cred), listen, up.Listener.Addr()), 0o644)
	p := startProxy(t, policy, true)
	_, port, _ := net.SplitHostPort(listen)

	// fetch dials the proxy from local, writes header, then runs a TLS
	// handshake (SNI example.com, the test server's certificate) and one
	// HTTP/1.1 request over it.
	fetch := func(local, header, path string) (string, error) {
		t.Helper()
		d := net.Dialer{Timeout: 10 * time.Second, LocalAddr: &net.TCPAddr{IP: net.ParseIP(local)}}
		conn, err := d.Dial("tcp", listen)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		conn.SetDeadline(time.Now().Add(20 * time.Second))
		if _, err := io.WriteString(conn, header); err != nil {
			return "", err
		}
		tc := tls.Client(conn, &tls.Config{RootCAs: roots, ServerName: "example.com"})
		if err := tc.Handshake(); err != nil {
			return "", fmt.Errorf("handshake: %w", err)
		}
		if _, err := io.WriteString(tc, "GET "+path+" HTTP/1.1\r\nHost: example.com\r\nConnection: close\r\n\r\n"); err != nil {
			return "", err
		}
		resp, err := http.ReadResponse(bufio.NewReader(tc), nil)
		if err != nil {
			return "", err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		return fmt.Sprintf("%d %s", resp.StatusCode, b), err
	}
	proxyHeader := "PROXY TCP4 192.0.2.44 127.0.0.1 5555 " + port + "\r\n"
	for i := 1; i <= 2; i++ {
		path := fmt.Sprintf("/conn/%d", i)
		if out, err := fetch("127.0.0.1", proxyHeader, path); err != nil || out != "200 tls "+path+"\n" {
			t.Fatalf("connection %d from 192.0.2.44: %q %v", i, out, err)
		}
	}
	if out, err := fetch("127.0.0.1", proxyHeader, "/conn/3"); err == nil {
		t.Fatalf("third connection from 192.0.2.44 (burst 2) was relayed: %q", out)
	}
	if n := hits.Load(); n != 2 {
		t.Fatalf("the TLS server served %d requests, want 2", n)
	}
	// A connection's access line is written when both of its sides
	// have closed, so the lines of relayed connections may come after
	// the quick deny's: count verdicts, not their order.
	var lines []map[string]any
	testkit.WaitFor(t, "3 access lines", func() bool { lines = p.access(); return len(lines) >= 3 })
	verdicts := map[any]int{}
	for i, l := range lines[:3] {
		verdicts[l["verdict"]]++
		if l["proto"] != "tls-passthrough" || l["sni"] != "example.com" || l["remote"] != "192.0.2.44:5555" ||
			!strings.HasPrefix(fmt.Sprint(l["peer"]), "127.0.0.1:") {
			t.Errorf("access line %d: proto %v sni %v remote %v peer %v; want tls-passthrough, example.com, 192.0.2.44:5555, 127.0.0.1:port",
				i+1, l["proto"], l["sni"], l["remote"], l["peer"])
		}
	}
	if verdicts["allow"] != 2 || verdicts["deny"] != 1 {
		t.Errorf("verdicts of the 3 connections from 192.0.2.44: %v; want 2 allow, 1 deny", verdicts)
	}

	// Another client behind the same balancer has its own bucket.
	if out, err := fetch("127.0.0.1", "PROXY TCP4 192.0.2.45 127.0.0.1 6666 "+port+"\r\n", "/other"); err != nil || out != "200 tls /other\n" {
		t.Fatalf("connection from 192.0.2.45: %q %v", out, err)
	}

	// An untrusted peer's PROXY header: refused before the handshake.
	if out, err := fetch("127.0.0.2", "PROXY TCP4 192.0.2.99 127.0.0.1 7777 "+port+"\r\n", "/untrusted"); err == nil {
		t.Fatalf("untrusted PROXY header relayed: %q", out)
	}
	testkit.WaitFor(t, "the refusal counted", func() bool {
		return p.metric(`rl_tproxy_rejections_total{reason="proxy-header-untrusted",status="0"}`) == 1
	})
	// And the trusted balancer must send one.
	if out, err := fetch("127.0.0.1", "", "/no-header"); err == nil {
		t.Fatalf("trusted peer without a PROXY header relayed: %q", out)
	}
	if n := hits.Load(); n != 3 {
		t.Fatalf("the TLS server served %d requests, want 3", n)
	}
}
