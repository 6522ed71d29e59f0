package redirect

import (
	"net/netip"
	"path/filepath"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/rl-tproxy/rl-tproxy/internal/netnstest"
)

// TestSteeringBetweenNamespaces drives real TCP connections from a client
// namespace through a veth pair to a node namespace where an unchanged
// service listens on port 80 and the proxy's listener sits on loopback.
func TestSteeringBetweenNamespaces(t *testing.T) {
	requireBPF(t)
	p := netnstest.NewPair(t)
	node4 := netip.AddrPortFrom(p.NodeIP4, 80).String()
	node6 := netip.AddrPortFrom(p.NodeIP6, 80).String()

	service := listenTCP(t, p.Node, "tcp", ":80") // dual stack, like most services
	serve(t, service, "service")

	// Before anything is attached the service answers.
	if got := mustAsk(t, p.Client, node4, nil); got != "service "+node4 {
		t.Fatalf("before attach: %q", got)
	}

	r := attachIn(t, p.Node, Config{Ports: []uint16{80}})

	// Attached but no listener registered: falls through to the service.
	if got := mustAsk(t, p.Client, node4, nil); got != "service "+node4 {
		t.Fatalf("attached, no listener: %q", got)
	}

	proxy4 := listenTCP(t, p.Node, "tcp4", "127.0.0.1:0")
	serve(t, proxy4, "proxy")
	if err := r.RegisterListener(proxy4); err != nil {
		t.Fatal(err)
	}
	// Steered: the proxy accepts, and the connection's local address is the
	// original destination, not the listener's 127.0.0.1 address.
	if got := mustAsk(t, p.Client, node4, nil); got != "proxy "+node4 {
		t.Fatalf("steered: %q, want proxy %s", got, node4)
	}
	// Other ports are untouched.
	other := listenTCP(t, p.Node, "tcp4", ":81")
	serve(t, other, "other")
	if got := mustAsk(t, p.Client, netip.AddrPortFrom(p.NodeIP4, 81).String(), nil); !strings.HasPrefix(got, "other ") {
		t.Fatalf("port 81: %q", got)
	}

	// The proxy's own upstream connection through the bypass dialer reaches
	// the real service from inside the node, even with local clients steered.
	if err := r.SetSteerLoopback(true); err != nil {
		t.Fatal(err)
	}
	if got := mustAsk(t, p.Node, node4, nil); got != "proxy "+node4 {
		t.Fatalf("local client, steer_loopback on: %q", got)
	}
	if got := mustAsk(t, p.Node, "127.0.0.1:80", nil); got != "proxy 127.0.0.1:80" {
		t.Fatalf("local client to 127.0.0.1, steer_loopback on: %q", got)
	}
	for _, addr := range []string{node4, "127.0.0.1:80"} {
		if got := mustAsk(t, p.Node, addr, r.DialContext); got != "service "+addr {
			t.Fatalf("bypass dial %s: %q, want the service (no loop)", addr, got)
		}
	}
	if st := statusIn(t, p.Node, filepath.Dir(r.Dir())); st.BypassEntries != 0 {
		t.Errorf("bypass entries left after dials: %d", st.BypassEntries)
	}
	if err := r.SetSteerLoopback(false); err != nil {
		t.Fatal(err)
	}
	for _, addr := range []string{node4, "127.0.0.1:80", "127.0.0.2:80"} {
		if got := mustAsk(t, p.Node, addr, nil); got != "service "+addr {
			t.Fatalf("local client to %s, steer_loopback off: %q", addr, got)
		}
	}

	// The proxy goes away: connections fall through to the service, none refused.
	proxy4.Close()
	for range 3 {
		if got := mustAsk(t, p.Client, node4, nil); got != "service "+node4 {
			t.Fatalf("after proxy listener closed: %q", got)
		}
	}
	// A new proxy registers its listener: steering resumes.
	proxy4b := listenTCP(t, p.Node, "tcp4", "127.0.0.1:0")
	serve(t, proxy4b, "proxy2")
	if err := r.RegisterListener(proxy4b); err != nil {
		t.Fatal(err)
	}
	if got := mustAsk(t, p.Client, node4, nil); got != "proxy2 "+node4 {
		t.Fatalf("after re-register: %q", got)
	}
	// Takeover: a third listener replaces the second while it still runs;
	// closing the old one later leaves the new one in place.
	proxy4c := listenTCP(t, p.Node, "tcp4", "127.0.0.1:0")
	serve(t, proxy4c, "proxy3")
	if err := r.RegisterListener(proxy4c); err != nil {
		t.Fatal(err)
	}
	if got := mustAsk(t, p.Client, node4, nil); got != "proxy3 "+node4 {
		t.Fatalf("after takeover: %q", got)
	}
	if on, err := r.ListenerRegistered(proxy4b); err != nil || on {
		t.Errorf("taken-over listener still registered: %v %v", on, err)
	}
	if on, err := r.ListenerRegistered(proxy4c); err != nil || !on {
		t.Errorf("new listener not registered: %v %v", on, err)
	}
	proxy4b.Close()
	if got := mustAsk(t, p.Client, node4, nil); got != "proxy3 "+node4 {
		t.Fatalf("after the old listener closed: %q", got)
	}

	// IPv6: an IPv6-only proxy listener on ::1 takes IPv6 connections.
	if got := mustAsk(t, p.Client, node6, nil); got != "service "+node6 {
		t.Fatalf("IPv6 before a v6 listener: %q", got)
	}
	proxy6 := listenTCP(t, p.Node, "tcp6", "[::1]:0")
	serve(t, proxy6, "proxy6")
	if err := r.RegisterListener(proxy6); err != nil {
		t.Fatal(err)
	}
	if got := mustAsk(t, p.Client, node6, nil); got != "proxy6 "+node6 {
		t.Fatalf("IPv6 steered: %q, want proxy6 %s", got, node6)
	}
	if got := mustAsk(t, p.Node, node6, r.DialContext); got != "service "+node6 {
		t.Fatalf("IPv6 bypass dial: %q", got)
	}
	for _, addr := range []string{node6, "[::1]:80"} {
		if got := mustAsk(t, p.Node, addr, nil); got != "service "+addr {
			t.Fatalf("IPv6 local client to %s, steer_loopback off: %q", addr, got)
		}
	}
	if got := mustAsk(t, p.Client, node4, nil); got != "proxy3 "+node4 {
		t.Fatalf("IPv4 after IPv6 registration: %q", got)
	}

	// A failed upstream dial leaves no bypass entry behind.
	if _, err := ask(p.Node, netip.AddrPortFrom(p.NodeIP4, 9).String(), r.DialContext); err == nil {
		t.Fatal("bypass dial to a closed port succeeded")
	}
	if st := statusIn(t, p.Node, filepath.Dir(r.Dir())); st.BypassEntries != 0 {
		t.Errorf("bypass entries left after a failed dial: %d", st.BypassEntries)
	}

	c, err := r.Counters()
	if err != nil {
		t.Fatal(err)
	}
	// The metrics collector reports the same counters and both listener slots.
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(r.Collector())
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			key := mf.GetName()
			for _, l := range m.GetLabel() {
				key += "," + l.GetName() + "=" + l.GetValue()
			}
			got[key] = m.GetCounter().GetValue() + m.GetGauge().GetValue()
		}
	}
	wantMetrics := map[string]float64{
		"rl_tproxy_redirect_lookups_total,result=steered":      float64(c.Steered),
		"rl_tproxy_redirect_lookups_total,result=no_socket":    float64(c.NoSocket),
		"rl_tproxy_redirect_lookups_total,result=assign_error": 0,
		"rl_tproxy_redirect_lookups_total,result=bypassed":     float64(c.Bypassed),
		"rl_tproxy_redirect_lookups_total,result=not_matched":  float64(c.NotMatched),
		"rl_tproxy_redirect_lookups_total,result=loopback":     float64(c.Loopback),
		"rl_tproxy_redirect_listener_slots,family=ipv4":        1,
		"rl_tproxy_redirect_listener_slots,family=ipv6":        1,
		"rl_tproxy_redirect_scrape_errors":                     0,
	}
	for k, v := range wantMetrics {
		if g, ok := got[k]; !ok || g != v {
			t.Errorf("metric %s = %v (present %v), want %v", k, g, ok, v)
		}
	}
	if c.Steered < 6 || c.NoSocket < 4 || c.Bypassed < 3 || c.Loopback < 1 || c.AssignError != 0 {
		t.Errorf("counters after the scenario: %+v", c)
	}

	// Unsteering the port hands it back to the service.
	if err := r.SetPorts(nil); err != nil {
		t.Fatal(err)
	}
	if got := mustAsk(t, p.Client, node4, nil); got != "service "+node4 {
		t.Fatalf("after SetPorts(nil): %q", got)
	}
}

// TestDualStackListenerAndDetach registers one dual-stack listener for both
// families, then detaches: traffic goes back to the service.
func TestDualStackListenerAndDetach(t *testing.T) {
	requireBPF(t)
	p := netnstest.NewPair(t)
	node4 := netip.AddrPortFrom(p.NodeIP4, 80).String()
	node6 := netip.AddrPortFrom(p.NodeIP6, 80).String()
	service := listenTCP(t, p.Node, "tcp", ":80")
	serve(t, service, "service")

	root := netnstest.BPFFS(t) + "/rl-tproxy"
	r := attachIn(t, p.Node, Config{PinRoot: root, Ports: []uint16{80}})
	proxy := listenTCP(t, p.Node, "tcp", "[::]:0") // dual stack
	serve(t, proxy, "proxy")
	if err := r.RegisterListener(proxy); err != nil {
		t.Fatal(err)
	}
	want4 := "proxy " + node4 // Go shows the v4-mapped address as IPv4
	if got := mustAsk(t, p.Client, node4, nil); got != want4 {
		t.Fatalf("IPv4 via dual-stack listener: %q, want %q", got, want4)
	}
	if got := mustAsk(t, p.Client, node6, nil); got != "proxy "+node6 {
		t.Fatalf("IPv6 via dual-stack listener: %q", got)
	}
	// Unregister empties both slots: traffic falls through while it drains.
	if err := r.UnregisterListener(proxy); err != nil {
		t.Fatal(err)
	}
	if got := mustAsk(t, p.Client, node4, nil); got != "service "+node4 {
		t.Fatalf("after unregister: %q", got)
	}
	if err := r.RegisterListener(proxy); err != nil {
		t.Fatal(err)
	}
	if err := r.Check(); err != nil {
		t.Fatalf("Check while attached: %v", err)
	}
	// Detach removes the program even though this Redirect still holds descriptors.
	if err := p.Node.Do(func() error { return Detach(root) }); err != nil {
		t.Fatalf("Detach: %v", err)
	}
	for _, a := range []string{node4, node6} {
		if got := mustAsk(t, p.Client, a, nil); got != "service "+a {
			t.Fatalf("after Detach %s: %q", a, got)
		}
	}
	if err := r.Check(); err == nil {
		t.Fatal("Check after Detach: nil")
	}
}
