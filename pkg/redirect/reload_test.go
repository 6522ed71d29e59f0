package redirect

import (
	"net/netip"
	"slices"
	"testing"

	"github.com/rl-tproxy/rl-tproxy/internal/netnstest"
)

// Reload replaces ports, prefixes and the loopback flag exactly: what is no
// longer configured stops being steered.
func TestReloadReplacesSets(t *testing.T) {
	ns := netnstest.New(t)
	root := netnstest.BPFFS(t) + "/rl-tproxy"
	r := attachIn(t, ns, Config{PinRoot: root, Ports: []uint16{80, 81},
		Prefixes: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("fd00::/8"), netip.MustParsePrefix("10.1.2.3/24")}})
	st := statusIn(t, ns, root)
	wantPrefixes := []string{"10.0.0.0/8", "10.1.2.0/24", "fd00::/8"}
	var got []string
	for _, p := range st.Prefixes {
		got = append(got, p.String())
	}
	if !slices.Equal(got, wantPrefixes) || !slices.Equal(st.Ports, []uint16{80, 81}) || st.SteerLoopback {
		t.Fatalf("after attach: ports %v prefixes %v loopback %v", st.Ports, got, st.SteerLoopback)
	}

	ln := listenTCP(t, ns, "tcp4", "127.0.0.1:0")
	if err := r.RegisterListener(ln); err != nil {
		t.Fatal(err)
	}
	ap := netip.MustParseAddrPort
	steered := func(local string) bool {
		_, cookie, _ := run(t, r, lookupCtx(6, ap("192.168.9.9:4000"), ap(local)))
		return cookie != 0
	}
	if !steered("10.5.5.5:81") || steered("172.16.0.1:81") || steered("10.5.5.5:82") {
		t.Fatal("initial steering decisions wrong")
	}

	if err := r.Reload(Config{Ports: []uint16{82}, Prefixes: []netip.Prefix{netip.MustParsePrefix("172.16.0.0/12")}, SteerLoopback: true}); err != nil {
		t.Fatal(err)
	}
	st = statusIn(t, ns, root)
	if !slices.Equal(st.Ports, []uint16{82}) || len(st.Prefixes) != 1 || st.Prefixes[0].String() != "172.16.0.0/12" || !st.SteerLoopback {
		t.Fatalf("after reload: ports %v prefixes %v loopback %v", st.Ports, st.Prefixes, st.SteerLoopback)
	}
	if steered("10.5.5.5:82") || steered("172.16.0.1:81") || !steered("172.16.0.1:82") {
		t.Fatal("steering decisions after reload wrong")
	}

	// No prefixes: every destination again.
	if err := r.Reload(Config{Ports: []uint16{82}}); err != nil {
		t.Fatal(err)
	}
	if st := statusIn(t, ns, root); len(st.Prefixes) != 0 || st.SteerLoopback {
		t.Fatalf("after clearing prefixes: %v loopback %v", st.Prefixes, st.SteerLoopback)
	}
	if !steered("10.5.5.5:82") {
		t.Fatal("any destination not steered after clearing prefixes")
	}
	if err := r.Reload(Config{Ports: []uint16{0}}); err == nil {
		t.Fatal("Reload accepted port 0")
	}
}
