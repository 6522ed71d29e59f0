package main

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rl-tproxy/rl-tproxy/internal/testkit"
	"github.com/rl-tproxy/rl-tproxy/pkg/ratelimitly/wire"
)

const testServerCreds = `credentials:
  - tenant: acme
    key_id: 7
    secret: AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=
`

func writeServerCreds(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "creds.yaml")
	if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestServerCommandServesAndDrains(t *testing.T) {
	creds := writeServerCreds(t, testServerCreds)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	type addrs struct {
		udp   netip.AddrPort
		admin net.Addr
	}
	readyc := make(chan addrs, 1)
	done := make(chan int, 1)
	var stderr testkit.SyncBuffer
	go func() {
		done <- runServerCtx(ctx, []string{"--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0", "--credentials", creds, "--workers", "2", "--dedup-capacity", "4100"},
			io.Discard, &stderr, func(u netip.AddrPort, a net.Addr) { readyc <- addrs{u, a} })
	}()
	var a addrs
	select {
	case a = <-readyc:
	case code := <-done:
		t.Fatalf("exited %d: %s", code, stderr.String())
	}

	// one decision over UDP
	var secret [32]byte
	for i := range secret {
		secret[i] = byte(i)
	}
	key, _ := wire.NewKey(7, secret)
	conn, err := net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(a.udp))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	h := wire.Header{TTLms: 60, RequestID: 42, Timestamp: uint64(time.Now().UnixMilli())}
	pkt, _ := key.Seal(nil, &h, &wire.RateRequest{Resources: []wire.Resource{{Bucket: []byte("b"), Rate: 10, PeriodMs: 1000, Cost: 1}}})
	if _, err := conn.Write(pkt); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 2048)
	_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second)) // bounds a failing test only
	n, err := conn.Read(buf)
	if err != nil {
		t.Fatal(err)
	}
	var rh wire.Header
	var resp wire.RateResponse
	if err := key.OpenBody(buf[:n], &rh, &resp); err != nil || !resp.Success || rh.RequestID != 42 {
		t.Fatalf("answer %+v %v", resp, err)
	}

	// metrics on the admin address
	res, err := http.Get("http://" + a.admin.String() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(res.Body)
	res.Body.Close()
	for _, want := range []string{`rlserver_decisions_total{result="allow"} 1`, `rlserver_workers 2`, `rlserver_keys{table="buckets"} 1`, `rlserver_capacity{table="dedup"} 4096`, "go_goroutines"} {
		if !strings.Contains(string(body), want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}

	cancel() // what SIGTERM does
	if code := <-done; code != exitOK {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	if !strings.Contains(stderr.String(), "draining") {
		t.Fatalf("no drain log: %s", stderr.String())
	}
}

func TestServerCommandExitCodes(t *testing.T) {
	good := writeServerCreds(t, testServerCreds)
	bad := writeServerCreds(t, "tenant: x\nkey_id: 1\nsecret: short\n")
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	cases := []struct {
		args []string
		want int
	}{
		{[]string{"--credentials", good}, exitInvalid},
		{[]string{"--listen", "127.0.0.1:0"}, exitInvalid},
		{[]string{"--listen", "127.0.0.1:0", "--credentials", bad}, exitInvalid},
		{[]string{"--listen", "127.0.0.1:0", "--credentials", filepath.Join(t.TempDir(), "missing")}, exitInvalid},
		{[]string{"--listen", "127.0.0.1:0", "--credentials", good, "--workers", "-1"}, exitInvalid},
		{[]string{"--listen", "127.0.0.1:0", "--credentials", good, "--dedup-capacity", "0"}, exitInvalid},
		{[]string{"--listen", "127.0.0.1:0", "--credentials", good, "--dedup-capacity", "63"}, exitInvalid},
		{[]string{"--listen", "127.0.0.1:0", "--credentials", good, "--dedup-capacity", "33554433"}, exitInvalid},
		{[]string{"--listen", "127.0.0.1:0", "--credentials", good, "--dedup-capacity", "1e9"}, exitInvalid},
		{[]string{"--listen", "nope:port", "--credentials", good}, exitInvalid},
		{[]string{"--listen", "127.0.0.1:0", "--credentials", good, "--bogus"}, exitInvalid},
		{[]string{"--listen", "127.0.0.1:0", "--credentials", good, "--admin", busy.Addr().String()}, exitRuntime},
		{[]string{"--listen", "192.0.2.1:0", "--credentials", good, "--admin", "127.0.0.1:0"}, exitRuntime}, // address not on this host
	}
	for _, c := range cases {
		var errb testkit.SyncBuffer
		ctx, cancel := context.WithCancel(context.Background())
		cancel() // if it would serve, stop at once
		if got := runServerCtx(ctx, c.args, io.Discard, &errb, nil); got != c.want {
			t.Errorf("%v: exit %d, want %d (%s)", c.args, got, c.want, errb.String())
		}
		if strings.Contains(errb.String(), "AAECAwQF") {
			t.Errorf("%v: secret in output", c.args)
		}
	}
}
