package dnstest

import (
	"bytes"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/rl-tproxy/rl-tproxy/internal/testkit"
)

// Dnsmasq is a dnsmasq process serving one SRV name for a test.
type Dnsmasq struct {
	Addr    string // "127.0.0.1:port"
	cmd     *exec.Cmd
	out     *bytes.Buffer
	waitErr error // set before exited is closed
}

// StartDnsmasq starts dnsmasq on a free loopback port answering srvName
// with targets (SRV plus A/AAAA host records) with the given TTL. Without
// dnsmasq the test ends through testkit.Missing (a skip, or a failure under
// RL_TPROXY_STRICT=1). The process is stopped when the
// test ends.
func StartDnsmasq(t testing.TB, srvName string, ttl uint32, targets ...Target) *Dnsmasq {
	t.Helper()
	bin := testkit.NeedTool(t, "dnsmasq", "dnsmasq-base")
	var lastErr error
	for attempt := 0; attempt < 5; attempt++ {
		port, err := freePort()
		if err != nil {
			t.Fatalf("dnsmasq: free port: %v", err)
		}
		args := []string{
			"--keep-in-foreground", "--conf-file=/dev/null", "--no-resolv", "--no-hosts",
			"--no-poll", "--pid-file=", "--bind-interfaces", "--listen-address=127.0.0.1",
			"--port=" + strconv.Itoa(port), "--log-facility=-",
			"--local-ttl=" + strconv.Itoa(int(ttl)), "--auth-ttl=" + strconv.Itoa(int(ttl)),
		}
		if os.Geteuid() == 0 {
			args = append(args, "--user=root")
		}
		for _, tg := range targets {
			args = append(args, fmt.Sprintf("--srv-host=%s,%s,%d,%d,%d",
				trimDot(srvName), trimDot(tg.Name), tg.Port, tg.Priority, tg.Weight))
			for _, a := range tg.Addrs {
				args = append(args, fmt.Sprintf("--host-record=%s,%s,%d", trimDot(tg.Name), a, ttl))
			}
		}
		d := &Dnsmasq{Addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), out: new(bytes.Buffer)}
		d.cmd = exec.Command(bin, args...)
		d.cmd.Stdout, d.cmd.Stderr = d.out, d.out
		if err := d.cmd.Start(); err != nil {
			t.Fatalf("dnsmasq: start: %v", err)
		}
		exited := make(chan struct{}) // closed when the process has exited
		go func() { d.waitErr = d.cmd.Wait(); close(exited) }()
		if err := d.waitReady(srvName, exited); err != nil {
			d.cmd.Process.Kill()
			<-exited
			lastErr = fmt.Errorf("%w; output: %s", err, d.out.String())
			continue
		}
		t.Cleanup(func() {
			d.cmd.Process.Kill()
			<-exited
		})
		return d
	}
	t.Fatalf("dnsmasq: did not come up: %v", lastErr)
	return nil
}

// waitReady polls the SRV name until dnsmasq answers (bounded: 100 tries,
// each a query with a 100 ms timeout then a 20 ms pause) or the process
// exits.
func (d *Dnsmasq) waitReady(name string, exited <-chan struct{}) error {
	c := &dns.Client{Net: "udp", Timeout: 100 * time.Millisecond}
	m := new(dns.Msg)
	m.SetQuestion(dns.Fqdn(name), dns.TypeSRV)
	for i := 0; i < 100; i++ {
		r, _, err := c.Exchange(m, d.Addr)
		if err == nil && r.Rcode == dns.RcodeSuccess && len(r.Answer) > 0 {
			return nil
		}
		select {
		case <-exited:
			return fmt.Errorf("dnsmasq exited: %v", d.waitErr)
		case <-time.After(20 * time.Millisecond):
		}
	}
	return fmt.Errorf("no SRV answer from %s", d.Addr)
}

// freePort finds a loopback port free for both UDP and TCP, below the
// ephemeral range (testkit.FreePort).
func freePort() (int, error) { return testkit.FreePort(true, true) }

func trimDot(s string) string {
	if len(s) > 0 && s[len(s)-1] == '.' {
		return s[:len(s)-1]
	}
	return s
}
