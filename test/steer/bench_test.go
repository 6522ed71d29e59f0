package steer

import (
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"testing"
)

// TestWrkNewConnections measures new connections per second end to end
// with wrk (Connection: close, so every request is a new connection) from
// the client namespace, through the same rl-tproxy process to nginx:
//
//   - steered: nginx's own address and port (10.200.0.1:80), handed to the
//     proxy by sk_lookup;
//   - listener: the same proxy listening itself on 10.200.0.1:8080 (listener
//     mode; the sk_lookup program runs and passes);
//
// in alternating rounds, then nginx alone (the proxy stopped, port 80
// falls through) as a reference. In every test run it makes one short round
// and asserts that every new connection, steered or not, got a 200 and none
// was refused; RL_TPROXY_STEER_BENCH=1 makes it the measurement of
// docs/bench/steer.md (3 rounds of 5 s; the ratio is logged, never asserted).
func TestWrkNewConnections(t *testing.T) {
	rounds, dur, conns := 1, "1s", 4
	if os.Getenv("RL_TPROXY_STEER_BENCH") == "1" {
		rounds, dur = 3, "5s"
	}
	if v, err := strconv.Atoi(os.Getenv("RL_TPROXY_STEER_BENCH_ROUNDS")); err == nil && v > 0 {
		rounds = v
	}
	if v := os.Getenv("RL_TPROXY_STEER_BENCH_DURATION"); v != "" {
		dur = v
	}
	e := newEnv(t, false)
	e.policy = filepath.Join(e.dir, "bench-policy.yaml")
	body := fmt.Sprintf(`ratelimitly:
  srv: %s
  resolver: %s
  credentials: %s
  fail: open
services:
  - name: steered
    port: 80
    upstream: "127.0.0.1:80"
    locations: []
  - name: listener
    listen: "%s"
    upstream: "127.0.0.1:80"
    locations: []
`, srvName, e.dns.Addr, filepath.Join(e.dir, "credentials.yaml"), netip.AddrPortFrom(e.nodeIP, 8080))
	if err := os.WriteFile(e.policy, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	px := e.startProxy(proxyName)
	run := func(mode, url string) float64 {
		w := e.wrk(e.pair.Client.Name, url, conns, dur, true)
		if w.connectErrs != 0 || w.nonSuccess != 0 || w.other != 0 || w.s200 != w.requests {
			t.Fatalf("%s: %+v: want only 200s and no connect errors", mode, w)
		}
		t.Logf("%-9s %8.0f conn/s (%d requests, read errors %d)", mode, w.reqPerSec, w.requests, w.readErrs)
		return w.reqPerSec
	}
	steered := "http://" + netip.AddrPortFrom(e.nodeIP, 80).String() + "/bench"
	listener := "http://" + netip.AddrPortFrom(e.nodeIP, 8080).String() + "/bench"
	var ratios []float64
	for i := range rounds {
		var s, l float64
		if i%2 == 0 {
			s, l = run("steered", steered), run("listener", listener)
		} else {
			l, s = run("listener", listener), run("steered", steered)
		}
		ratios = append(ratios, s/l)
		t.Logf("round %d: steered %.0f, listener %.0f conn/s, steered/listener %.2f", i+1, s, l, s/l)
	}
	sort.Float64s(ratios)
	t.Logf("steered/listener ratio: median %.2f over %d rounds (min %.2f, max %.2f)", ratios[len(ratios)/2], rounds, ratios[0], ratios[len(ratios)-1])
	if err := px.cmd.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	if !px.waitExit(waitBound) {
		t.Fatal("proxy did not stop")
	}
	run("nginx", steered) // the slot is empty now: straight to nginx
}
