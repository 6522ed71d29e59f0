package redirect

import (
	"encoding/binary"
	"net"
	"net/netip"
	"syscall"
	"testing"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/rl-tproxy/rl-tproxy/internal/netnstest"
)

// skLookupCtx mirrors struct bpf_sk_lookup (uapi/linux/bpf.h).
type skLookupCtx struct {
	Cookie         uint64
	Family         uint32
	Protocol       uint32
	RemoteIP4      uint32
	RemoteIP6      [4]uint32
	RemotePort     uint16 // network byte order
	_              uint16
	LocalIP4       uint32
	LocalIP6       [4]uint32
	LocalPort      uint32 // host byte order
	IngressIfindex uint32 // must be 0 in PROG_TEST_RUN
	_              uint32 // tail padding of the C struct
}

func lookupCtx(proto uint32, remote, local netip.AddrPort) skLookupCtx {
	var c skLookupCtx
	c.Protocol = proto
	var rp [2]byte
	binary.BigEndian.PutUint16(rp[:], remote.Port())
	c.RemotePort = binary.NativeEndian.Uint16(rp[:])
	c.LocalPort = uint32(local.Port())
	if remote.Addr().Is4() {
		c.Family = unix.AF_INET
		r, l := remote.Addr().As4(), local.Addr().As4()
		c.RemoteIP4 = binary.NativeEndian.Uint32(r[:])
		c.LocalIP4 = binary.NativeEndian.Uint32(l[:])
		return c
	}
	c.Family = unix.AF_INET6
	r, l := remote.Addr().As16(), local.Addr().As16()
	for i := range 4 {
		c.RemoteIP6[i] = binary.NativeEndian.Uint32(r[4*i:])
		c.LocalIP6[i] = binary.NativeEndian.Uint32(l[4*i:])
	}
	return c
}

func cookieOf(t *testing.T, ln net.Listener) uint64 {
	t.Helper()
	rc, err := ln.(syscall.Conn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var cookie uint64
	var gerr error
	if err := rc.Control(func(fd uintptr) {
		cookie, gerr = unix.GetsockoptUint64(int(fd), unix.SOL_SOCKET, unix.SO_COOKIE)
	}); err != nil || gerr != nil {
		t.Fatalf("SO_COOKIE: %v %v", err, gerr)
	}
	return cookie
}

// run executes the program on ctx and returns its verdict, the selected
// socket's cookie (0 = none) and the counter deltas.
func run(t *testing.T, r *Redirect, ctx skLookupCtx) (uint32, uint64, Counters) {
	t.Helper()
	before, err := r.Counters()
	if err != nil {
		t.Fatal(err)
	}
	var out skLookupCtx
	ret, err := r.prog.Run(&ebpf.RunOptions{Context: ctx, ContextOut: &out})
	if err != nil {
		t.Fatalf("PROG_TEST_RUN: %v", err)
	}
	after, err := r.Counters()
	if err != nil {
		t.Fatal(err)
	}
	return ret, out.Cookie, Counters{
		Steered:     after.Steered - before.Steered,
		NoSocket:    after.NoSocket - before.NoSocket,
		AssignError: after.AssignError - before.AssignError,
		Bypassed:    after.Bypassed - before.Bypassed,
		NotMatched:  after.NotMatched - before.NotMatched,
		Loopback:    after.Loopback - before.Loopback,
	}
}

const skPass = 1

func TestProgramVerdicts(t *testing.T) {
	requireRoot(t)
	ns := netnstest.New(t)
	r := attachIn(t, ns, Config{Ports: []uint16{80, 443}})
	ln4 := listenTCP(t, ns, "tcp4", "127.0.0.1:0")
	ln6 := listenTCP(t, ns, "tcp6", "[::1]:0")
	ln6only := ln6 // [::1] sockets are IPv6-only
	c4, c6 := cookieOf(t, ln4), cookieOf(t, ln6)

	ap := netip.MustParseAddrPort
	client4 := ap("10.9.0.2:40000")
	client6 := ap("[fd00:9::2]:40000")
	node4 := ap("10.9.0.1:80")
	node6 := ap("[fd00:9::1]:80")

	type state struct {
		listeners     bool
		wrongFamily   bool // an IPv6-only socket in the IPv4 slot
		bypass        []netip.AddrPort
		prefixes      []netip.Prefix
		steerLoopback bool
	}
	cases := []struct {
		name   string
		st     state
		ctx    skLookupCtx
		cookie uint64 // expected selected socket, 0 = none
		want   Counters
	}{
		{"port not steered", state{listeners: true}, lookupCtx(unix.IPPROTO_TCP, client4, ap("10.9.0.1:8080")), 0, Counters{NotMatched: 1}},
		{"udp ignored", state{listeners: true}, lookupCtx(unix.IPPROTO_UDP, client4, node4), 0, Counters{}},
		{"steered no socket v4", state{}, lookupCtx(unix.IPPROTO_TCP, client4, node4), 0, Counters{NoSocket: 1}},
		{"steered no socket v6", state{}, lookupCtx(unix.IPPROTO_TCP, client6, node6), 0, Counters{NoSocket: 1}},
		{"steered v4", state{listeners: true}, lookupCtx(unix.IPPROTO_TCP, client4, node4), c4, Counters{Steered: 1}},
		{"steered second port", state{listeners: true}, lookupCtx(unix.IPPROTO_TCP, client4, ap("10.9.0.1:443")), c4, Counters{Steered: 1}},
		{"steered v6", state{listeners: true}, lookupCtx(unix.IPPROTO_TCP, client6, node6), c6, Counters{Steered: 1}},
		{"bypass v4", state{listeners: true, bypass: []netip.AddrPort{client4}}, lookupCtx(unix.IPPROTO_TCP, client4, node4), 0, Counters{Bypassed: 1}},
		{"bypass v6", state{listeners: true, bypass: []netip.AddrPort{client6}}, lookupCtx(unix.IPPROTO_TCP, client6, node6), 0, Counters{Bypassed: 1}},
		{"bypass other port", state{listeners: true, bypass: []netip.AddrPort{ap("10.9.0.2:40001")}}, lookupCtx(unix.IPPROTO_TCP, client4, node4), c4, Counters{Steered: 1}},
		{"bypass other ip", state{listeners: true, bypass: []netip.AddrPort{ap("10.9.0.3:40000")}}, lookupCtx(unix.IPPROTO_TCP, client4, node4), c4, Counters{Steered: 1}},
		{"bypass byte-swapped port", state{listeners: true, bypass: []netip.AddrPort{ap("10.9.0.2:16540")}}, lookupCtx(unix.IPPROTO_TCP, client4, node4), c4, Counters{Steered: 1}}, // 40000 = 0x9c40, swapped 0x409c = 16540
		{"loopback v4 not steered", state{listeners: true}, lookupCtx(unix.IPPROTO_TCP, ap("127.0.0.1:40000"), ap("127.0.0.1:80")), 0, Counters{Loopback: 1}},
		{"loopback 127/8 not steered", state{listeners: true}, lookupCtx(unix.IPPROTO_TCP, ap("127.0.0.1:40000"), ap("127.3.2.1:80")), 0, Counters{Loopback: 1}},
		{"loopback v6 not steered", state{listeners: true}, lookupCtx(unix.IPPROTO_TCP, ap("[::1]:40000"), ap("[::1]:80")), 0, Counters{Loopback: 1}},
		{"local client to node address v4", state{listeners: true}, lookupCtx(unix.IPPROTO_TCP, ap("10.9.0.1:40000"), node4), 0, Counters{Loopback: 1}},
		{"local client to node address v6", state{listeners: true}, lookupCtx(unix.IPPROTO_TCP, ap("[fd00:9::1]:40000"), node6), 0, Counters{Loopback: 1}},
		{"local client steered when asked", state{listeners: true, steerLoopback: true}, lookupCtx(unix.IPPROTO_TCP, ap("10.9.0.1:40000"), node4), c4, Counters{Steered: 1}},
		{"loopback v4 steered when asked", state{listeners: true, steerLoopback: true}, lookupCtx(unix.IPPROTO_TCP, ap("127.0.0.1:40000"), ap("127.0.0.1:80")), c4, Counters{Steered: 1}},
		{"loopback v6 steered when asked", state{listeners: true, steerLoopback: true}, lookupCtx(unix.IPPROTO_TCP, ap("[::1]:40000"), ap("[::1]:80")), c6, Counters{Steered: 1}},
		{"bypass wins over steer_loopback", state{listeners: true, steerLoopback: true, bypass: []netip.AddrPort{ap("127.0.0.1:40000")}}, lookupCtx(unix.IPPROTO_TCP, ap("127.0.0.1:40000"), ap("127.0.0.1:80")), 0, Counters{Bypassed: 1}},
		{"prefix match v4", state{listeners: true, prefixes: []netip.Prefix{netip.MustParsePrefix("10.9.0.0/16")}}, lookupCtx(unix.IPPROTO_TCP, client4, node4), c4, Counters{Steered: 1}},
		{"prefix mismatch v4", state{listeners: true, prefixes: []netip.Prefix{netip.MustParsePrefix("10.8.0.0/16")}}, lookupCtx(unix.IPPROTO_TCP, client4, node4), 0, Counters{NotMatched: 1}},
		{"prefix host route v4", state{listeners: true, prefixes: []netip.Prefix{netip.MustParsePrefix("10.9.0.1/32")}}, lookupCtx(unix.IPPROTO_TCP, client4, node4), c4, Counters{Steered: 1}},
		{"prefix match v6", state{listeners: true, prefixes: []netip.Prefix{netip.MustParsePrefix("fd00:9::/64")}}, lookupCtx(unix.IPPROTO_TCP, client6, node6), c6, Counters{Steered: 1}},
		{"prefix mismatch v6", state{listeners: true, prefixes: []netip.Prefix{netip.MustParsePrefix("fd00:8::/64")}}, lookupCtx(unix.IPPROTO_TCP, client6, node6), 0, Counters{NotMatched: 1}},
		{"v4-only prefixes exclude v6", state{listeners: true, prefixes: []netip.Prefix{netip.MustParsePrefix("10.9.0.0/16")}}, lookupCtx(unix.IPPROTO_TCP, client6, node6), 0, Counters{NotMatched: 1}},
		{"assign error", state{listeners: true, wrongFamily: true}, lookupCtx(unix.IPPROTO_TCP, client4, node4), 0, Counters{AssignError: 1}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			// Reset the maps to the case's state.
			for _, s := range []uint32{SlotIPv4, SlotIPv6} {
				_ = r.maps.Sockets.Delete(s)
			}
			if tc.st.listeners {
				if err := r.RegisterListener(ln4); err != nil {
					t.Fatal(err)
				}
				if err := r.RegisterListener(ln6); err != nil {
					t.Fatal(err)
				}
			}
			if tc.st.wrongFamily {
				var werr error
				rc, _ := ln6only.(*net.TCPListener).SyscallConn()
				_ = rc.Control(func(fd uintptr) {
					werr = r.maps.Sockets.Update(SlotIPv4, uint64(fd), ebpf.UpdateAny)
				})
				if werr != nil {
					t.Fatal(werr)
				}
			}
			for _, b := range tc.st.bypass {
				if err := r.maps.Bypass.Update(BypassKey(b), uint8(1), ebpf.UpdateAny); err != nil {
					t.Fatal(err)
				}
			}
			t.Cleanup(func() {
				for _, b := range tc.st.bypass {
					_ = r.maps.Bypass.Delete(BypassKey(b))
				}
			})
			if err := r.SetPrefixes(tc.st.prefixes); err != nil {
				t.Fatal(err)
			}
			if err := r.SetSteerLoopback(tc.st.steerLoopback); err != nil {
				t.Fatal(err)
			}

			verdict, cookie, delta := run(t, r, tc.ctx)
			if verdict != skPass {
				t.Errorf("verdict = %d, want SK_PASS", verdict)
			}
			if cookie != tc.cookie {
				t.Errorf("selected socket cookie = %d, want %d (v4 listener %d, v6 listener %d)", cookie, tc.cookie, c4, c6)
			}
			if delta != tc.want {
				t.Errorf("counter deltas = %+v, want %+v", delta, tc.want)
			}
		})
	}
}
