package steer

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/rl-tproxy/rl-tproxy/internal/testkit"
)

// Ports of the protocol test (node namespace). nginx serves the first
// three; the opaque ones are a byte-recording Go service.
const (
	tlsPort         = 443  // nginx ssl, plain: steered with tls: passthrough, per-SNI limit
	ppHTTPPort      = 8080 // nginx proxy_protocol: HTTP/1.1 through the proxy, proxy_protocol: v1
	ppTLSPort       = 8443 // nginx ssl proxy_protocol: TLS passthrough, proxy_protocol: v2
	opaquePort      = 2222 // opaque: passthrough (the default)
	rejectPort      = 2223 // opaque: reject
	tlsName         = "tls.steer.test"
	tlsBurst        = 3
	protoProxyLabel = "rl-tproxy-protocols"
)

// TestSteerProtocols: on a node whose ports are steered to the proxy, an
// unchanged nginx serving TLS is reached through TLS passthrough (curl
// with --resolve), the 4th connection of a per-SNI burst of 3 is refused,
// and kill -9 of the proxy falls back to nginx directly; nginx with
// proxy_protocol logs the client namespace's address for HTTP/1.1,
// HTTP/2 (h2c prior knowledge, forwarded as HTTP/1.1) and TLS; a real ssh client's banner and random bytes reach an opaque service
// unchanged, and on a reject port they are closed and counted.
func TestSteerProtocols(t *testing.T) { testSteerProtocols(t, false) }

// TestSteerProtocolsIPv6 is the same over IPv6 (the PROXY headers carry
// the client's IPv6 address: TCP6 in v1, AF_INET6 in v2).
func TestSteerProtocolsIPv6(t *testing.T) { testSteerProtocols(t, true) }

func testSteerProtocols(t *testing.T, v6 bool) {
	testkit.NeedTool(t, "ssh", "openssh-client")
	e := newEnv(t, v6)
	certPEM := e.startTLSNginx()
	opaque := e.startRecorder(opaquePort)
	rejected := e.startRecorder(rejectPort)
	e.policy = e.writeProtocolPolicy()
	px := e.startProxy(protoProxyLabel)
	client := e.clientIP.String()

	// TLS passthrough: the handshake is nginx's own, through the proxy.
	for i := 1; i <= tlsBurst; i++ {
		if out, err := e.curlTLS(certPEM, tlsPort, fmt.Sprintf("/burst/%d", i)); err != nil || out != "tls peer=127.0.0.1\n" {
			t.Fatalf("TLS connection %d of the burst: %q %v", i, out, err)
		}
	}
	if out, err := e.curlTLS(certPEM, tlsPort, "/burst/over"); err == nil {
		t.Fatalf("TLS connection after the per-SNI burst of %d succeeded: %q", tlsBurst, out)
	}
	deny := waitAccess(t, px, func(m map[string]any) bool { return m["sni"] == tlsName && m["verdict"] == "deny" })
	if deny["proto"] != "tls-passthrough" || deny["service"] != "nginx-tls" {
		t.Fatalf("deny access line %v", deny)
	}
	if n := countLines(e.nginxTLSLines(), "uri=/burst/"); n != tlsBurst {
		t.Fatalf("nginx saw %d burst requests, want %d", n, tlsBurst)
	}

	// PROXY protocol: nginx sees the client namespace's address.
	if out, err := e.curlHTTP(ppHTTPPort, "/pp/http"); err != nil || out != "pp="+client+"\n" {
		t.Fatalf("HTTP/1.1 with PROXY v1: %q %v, want pp=%s", out, err, client)
	}
	if out, err := e.curlHTTP(ppHTTPPort, "/pp/h2", "--http2-prior-knowledge"); err != nil || out != "pp="+client+"\n" {
		t.Fatalf("HTTP/2 (h2c, HTTP/1.1 upstream) with PROXY v1: %q %v, want pp=%s", out, err, client)
	}
	if out, err := e.curlTLS(certPEM, ppTLSPort, "/pp/tls"); err != nil || out != "pp="+client+"\n" {
		t.Fatalf("TLS passthrough with PROXY v2: %q %v, want pp=%s", out, err, client)
	}
	h2 := waitAccess(t, px, func(m map[string]any) bool { return m["path"] == "/pp/h2" })
	if h2["proto"] != "h2" {
		t.Fatalf("/pp/h2 access line %v, want proto h2", h2)
	}
	for _, uri := range []string{"/pp/http", "/pp/h2", "/pp/tls"} {
		if n := countLines(e.nginxTLSLines(), "uri="+uri, "peer="+client+" "); n != 1 {
			t.Fatalf("nginx log: %d lines for %s with peer=%s:\n%s", n, uri, client, strings.Join(e.nginxTLSLines(), "\n"))
		}
	}

	// Opaque passthrough: a real ssh client's banner, then exact bytes.
	ssh := exec.Command("ip", "netns", "exec", e.pair.Client.Name, "ssh", "-o", "BatchMode=yes",
		"-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null", "-o", "ConnectTimeout=20",
		"-p", fmt.Sprint(opaquePort), "probe@"+e.nodeIP.String(), "true")
	ssh.Stdin = strings.NewReader("")
	_ = ssh.Run() // the recorder answers a banner and closes: ssh fails after its banner went out
	if got := opaque.next(t); !bytes.HasPrefix(got, []byte("SSH-2.0-OpenSSH")) || !bytes.HasSuffix(got, []byte("\r\n")) {
		t.Fatalf("opaque service got %q from ssh, want its SSH-2.0 banner", got[:min(len(got), 80)])
	}
	random := make([]byte, 64<<10)
	rand.Read(random)
	random[0] = 0xff // never a token byte, never TLS
	for _, in := range [][]byte{[]byte("SSH-2.0-OpenSSH_9.2p1 Debian-2+deb12u3\r\n\x00\x00\x05\xdc\x06\x14"), random} {
		reply, err := e.sendRaw(opaquePort, in)
		if err != nil || reply != recorderBanner {
			t.Fatalf("opaque client got %q %v", reply, err)
		}
		if got := opaque.next(t); !bytes.Equal(got, in) {
			t.Fatalf("opaque service got %d bytes (%q...), want the %d sent", len(got), got[:min(len(got), 40)], len(in))
		}
	}

	// Reject: closed without reaching the service, counted.
	for _, in := range [][]byte{[]byte("SSH-2.0-OpenSSH_9.2p1\r\n"), random[:1024]} {
		if reply, _ := e.sendRaw(rejectPort, in); reply != "" {
			t.Fatalf("reject port answered %q", reply)
		}
	}
	testkit.WaitWithin(t, waitBound, "2 rejected opaque connections in /metrics", func() bool {
		return metricValue(t, e, px, `rl_tproxy_passthrough_connections_total{action="rejected",protocol="other",service="reject"}`) == "2"
	})
	if rejected.count() != 0 {
		t.Fatalf("a rejected connection reached the service")
	}

	// kill -9: the node keeps serving TLS, now nginx's own socket.
	px.kill9(t)
	if out, err := e.curlTLS(certPEM, tlsPort, "/after/kill"); err != nil || out != "tls peer="+client+"\n" {
		t.Fatalf("TLS after kill -9 of the proxy: %q %v, want nginx directly (peer %s)", out, err, client)
	}
}

// waitAccess waits for an access line of the proxy that match accepts.
func waitAccess(t *testing.T, px *proxy, match func(map[string]any) bool) map[string]any {
	t.Helper()
	var found map[string]any
	testkit.WaitWithin(t, waitBound, "access line", func() bool {
		for _, m := range px.access() {
			if match(m) {
				found = m
				return true
			}
		}
		return false
	})
	return found
}

// metricValue scrapes the proxy's /metrics for one series' value.
func metricValue(t *testing.T, e *env, px *proxy, series string) string {
	t.Helper()
	r, err := httpGet(e.pair.Node, px.admin, "/metrics", true)
	if err != nil {
		t.Fatalf("scrape: %v", err)
	}
	for _, l := range strings.Split(r.body, "\n") {
		if v, ok := strings.CutPrefix(l, series+" "); ok {
			return v
		}
	}
	return ""
}

// startTLSNginx writes a self-signed certificate for tlsName and starts a
// second, unchanged nginx: TLS on 443, HTTP with proxy_protocol on 8080,
// TLS with proxy_protocol on 8443 (realip takes the address from the
// PROXY header, as docs/operations.md shows). It returns the
// certificate's PEM path (curl's --cacert).
func (e *env) startTLSNginx() string {
	t := e.t
	dir := filepath.Join(e.dir, "nginx-tls")
	for _, d := range []string{"", "body", "proxy", "fastcgi", "uwsgi", "scgi"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	cert, key := filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	writeSelfSigned(t, cert, key, tlsName)
	conf := filepath.Join(dir, "nginx.conf")
	body := fmt.Sprintf(`daemon off;
master_process on;
worker_processes 1;
user root;
pid %[1]s/nginx.pid;
error_log %[1]s/error.log info;
events { worker_connections 1024; }
http {
    client_body_temp_path %[1]s/body;
    proxy_temp_path %[1]s/proxy;
    fastcgi_temp_path %[1]s/fastcgi;
    uwsgi_temp_path %[1]s/uwsgi;
    scgi_temp_path %[1]s/scgi;
    default_type text/plain;
    log_format proto 'port=$server_port peer=$remote_addr uri=$request_uri status=$status';
    access_log %[1]s/access.log proto;
    ssl_certificate %[2]s;
    ssl_certificate_key %[3]s;
    server {
        listen 0.0.0.0:%[4]d ssl;
        listen [::]:%[4]d ssl ipv6only=on;
        server_name %[7]s;
        location / { return 200 "tls peer=$remote_addr\n"; }
    }
    server {
        # The client address from the PROXY header (docs/operations.md).
        listen 0.0.0.0:%[5]d proxy_protocol;
        listen 0.0.0.0:%[6]d ssl proxy_protocol;
        set_real_ip_from 127.0.0.1;
        real_ip_header proxy_protocol;
        location / { return 200 "pp=$proxy_protocol_addr\n"; }
    }
}
`, dir, cert, key, tlsPort, ppHTTPPort, ppTLSPort, tlsName)
	if err := os.WriteFile(conf, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	p := startProc(t, "nginx-tls", exec.Command("ip", "netns", "exec", e.pair.Node.Name, "nginx", "-e", filepath.Join(dir, "error.log"), "-c", conf))
	t.Cleanup(func() {
		if !p.exited() {
			_ = p.cmd.Process.Signal(syscall.SIGTERM)
			p.waitExit(waitBound)
		}
	})
	testkit.WaitWithin(t, waitBound, "nginx-tls pid file", func() bool {
		if p.exited() {
			errLog, _ := os.ReadFile(filepath.Join(dir, "error.log"))
			t.Fatalf("nginx-tls exited: %v\n%s\n%s", p.waitErr(), p.tail(20), errLog)
		}
		_, err := os.Stat(filepath.Join(dir, "nginx.pid"))
		return err == nil
	})
	return cert
}

func (e *env) nginxTLSLines() []string {
	b, err := os.ReadFile(filepath.Join(e.dir, "nginx-tls", "access.log"))
	if err != nil {
		return nil
	}
	return strings.Split(strings.TrimRight(string(b), "\n"), "\n")
}

func writeSelfSigned(t *testing.T, certPath, keyPath, name string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name}, DNSNames: []string{name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(certPath, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyPath, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), 0o600); err != nil {
		t.Fatal(err)
	}
}

// writeProtocolPolicy steers the protocol test's ports.
func (e *env) writeProtocolPolicy() string {
	p := filepath.Join(e.dir, "policy-protocols.yaml")
	body := fmt.Sprintf(`ratelimitly:
  srv: %[1]s
  resolver: %[2]s
  credentials: %[3]s
  request_policy: {name: standard, unit: 250ms}
  fail: close
zones:
  per_sni: {bucket: "sni:{sni}", rate: 1/m, burst: %[4]d}
services:
  - name: nginx-tls
    port: %[5]d
    upstream: 127.0.0.1:%[5]d
    tls: passthrough
    locations:
      - name: by-sni
        match: {sni: [%[10]s]}
        limit: [per_sni]
  - name: pp-http
    port: %[6]d
    upstream: 127.0.0.1:%[6]d
    upstream_protocol: http1
    proxy_protocol: v1
    locations:
      - name: open
  - name: pp-tls
    port: %[7]d
    upstream: 127.0.0.1:%[7]d
    tls: passthrough
    proxy_protocol: v2
    locations:
      - name: open
  - name: opaque
    port: %[8]d
    upstream: 127.0.0.1:%[8]d
    locations:
      - name: open
  - name: reject
    port: %[9]d
    upstream: 127.0.0.1:%[9]d
    opaque: reject
    locations:
      - name: open
`, srvName, e.dns.Addr, filepath.Join(e.dir, "credentials.yaml"), tlsBurst, tlsPort, ppHTTPPort, ppTLSPort, opaquePort, rejectPort, tlsName)
	if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
		e.t.Fatal(err)
	}
	return p
}

// curlTLS fetches https://tlsName:port/path from the client namespace,
// resolving tlsName to the node's address and trusting certPEM.
func (e *env) curlTLS(certPEM string, port int, path string) (string, error) {
	url := fmt.Sprintf("https://%s:%d%s", tlsName, port, path)
	out, err := runBounded(e.t, waitBound, "ip", "netns", "exec", e.pair.Client.Name, "curl", "-sS", "--http1.1",
		"--max-time", "20", "--cacert", certPEM, "--resolve", fmt.Sprintf("%s:%d:%s", tlsName, port, curlAddr(e.nodeIP)), url)
	return string(out), err
}

// curlAddr is an address as curl's --resolve takes it ([v6] in brackets).
func curlAddr(a netip.Addr) string {
	if a.Is6() {
		return "[" + a.String() + "]"
	}
	return a.String()
}

// curlHTTP fetches http://node:port/path from the client namespace.
func (e *env) curlHTTP(port int, path string, opts ...string) (string, error) {
	url := fmt.Sprintf("http://%s%s", netip.AddrPortFrom(e.nodeIP, uint16(port)), path)
	args := append([]string{"netns", "exec", e.pair.Client.Name, "curl", "-sS", "--max-time", "20"}, opts...)
	out, err := runBounded(e.t, waitBound, "ip", append(args, url)...)
	return string(out), err
}

// recorderBanner is what the byte recorder answers first: an SSH-1
// banner, so a real ssh client (which sends its own banner at once)
// disconnects after the banner exchange.
const recorderBanner = "SSH-1.0-recorder\r\n"

// recorder is a service that answers a banner, then records every byte a
// connection sends until EOF.
type recorder struct {
	got   chan []byte
	mu    sync.Mutex
	conns int
}

// startRecorder listens on 127.0.0.1:port in the node namespace.
func (e *env) startRecorder(port int) *recorder {
	t := e.t
	var ln net.Listener
	if err := e.pair.Node.Do(func() error {
		var err error
		ln, err = net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	r := &recorder{got: make(chan []byte, 16)}
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
			r.mu.Lock()
			r.conns++
			r.mu.Unlock()
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				c.SetDeadline(time.Now().Add(waitBound))
				io.WriteString(c, recorderBanner)
				b, _ := io.ReadAll(c)
				r.got <- b
			}()
		}
	}()
	return r
}

func (r *recorder) next(t *testing.T) []byte {
	t.Helper()
	select {
	case b := <-r.got:
		return b
	case <-time.After(waitBound):
		t.Fatal("no connection reached the recorder")
		return nil
	}
}

func (r *recorder) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.conns
}

// sendRaw connects from the client namespace to the node's port, sends in,
// half-closes and returns everything the other side sent before closing.
func (e *env) sendRaw(port int, in []byte) (string, error) {
	var c net.Conn
	if err := e.pair.Client.Do(func() error {
		var err error
		c, err = net.DialTimeout("tcp", netip.AddrPortFrom(e.nodeIP, uint16(port)).String(), 10*time.Second)
		return err
	}); err != nil {
		return "", err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(waitBound))
	if _, err := c.Write(in); err != nil {
		return "", err
	}
	c.(*net.TCPConn).CloseWrite()
	b, err := io.ReadAll(c)
	return string(b), err
}
