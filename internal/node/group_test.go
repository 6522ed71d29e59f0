package node

import (
	"errors"
	"net"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/rl-tproxy/rl-tproxy/internal/testkit"
	"github.com/rl-tproxy/rl-tproxy/pkg/admission"
	"github.com/rl-tproxy/rl-tproxy/pkg/evloop"
)

// groupOf returns the listener group the node serves on addr (nil when
// none), read under n.mu.
func groupOf(rt *Node, addr string) []net.Listener {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	if l := rt.listeners[addr]; l != nil {
		return l.lns
	}
	return nil
}

func checkGroup(t *testing.T, lns []net.Listener, addr string, n int) {
	t.Helper()
	if len(lns) != n {
		t.Fatalf("%s: %d sockets, want a group of %d", addr, len(lns), n)
	}
	for _, ln := range lns {
		if ln.Addr().String() != addr {
			t.Fatalf("group socket on %v, want %s", ln.Addr(), addr)
		}
		rc, err := ln.(syscall.Conn).SyscallConn()
		if err != nil {
			t.Fatal(err)
		}
		var v int
		var gerr error
		if err := rc.Control(func(fd uintptr) { v, gerr = unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_REUSEPORT) }); err != nil || gerr != nil || v != 1 {
			t.Fatalf("%s: SO_REUSEPORT %d (%v %v)", addr, v, err, gerr)
		}
	}
}

// TestListenerModeGroups: every listen address is served by a SO_REUSEPORT
// group of one socket per CPU; a reload that drops an address closes
// every socket of its group (no socket left accepting connections nobody
// serves), and a new address gets a group of its own.
func TestListenerModeGroups(t *testing.T) {
	upA, upB := namedUpstream(t, "a"), namedUpstream(t, "b")
	la, lb := freeAddr(t), freeAddr(t)
	path := filepath.Join(t.TempDir(), "policy.yaml")
	writeTwoServices(t, path, la, upA, lb, upB)
	rt := startNode(t, path, false)
	n := rt.proxy.ListenGroupSize()
	checkGroup(t, groupOf(rt, la), la, n)
	checkGroup(t, groupOf(rt, lb), lb, n)
	// Many connections (each its own source port, so the kernel's hash
	// picks sockets all over the group) are all answered.
	for range 32 {
		if got := getBody(t, "http://"+lb+"/"); got != "b" {
			t.Fatalf("%s answered %q, want b", lb, got)
		}
	}

	oldB := groupOf(rt, lb)
	lb2 := freeAddr(t)
	writeTwoServices(t, path, la, upA, lb2, upB)
	if err := rt.reloader.Reload(admission.TriggerSignal); err != nil {
		t.Fatal(err)
	}
	checkGroup(t, groupOf(rt, lb2), lb2, n)
	if groupOf(rt, lb) != nil {
		t.Fatalf("%s still served after the reload dropped it", lb)
	}
	// Every socket of the dropped group is closed: nothing accepts on lb.
	for i, ln := range oldB {
		if _, err := ln.Accept(); !errors.Is(err, net.ErrClosed) {
			t.Fatalf("socket %d of the dropped group: Accept %v, want closed", i, err)
		}
	}
	for range 8 {
		c, err := net.DialTimeout("tcp", lb, 5*time.Second)
		if err == nil {
			c.Close()
			t.Fatalf("%s still accepts connections after its group was closed", lb)
		}
		// Refused, or reset when the SYN met a socket of the group in
		// the middle of its close (Go closes the descriptor once the
		// serve loop's Accept has returned): either way nobody serves lb.
		if !errors.Is(err, syscall.ECONNREFUSED) && !errors.Is(err, syscall.ECONNRESET) {
			t.Fatalf("dial %s: %v, want refused or reset", lb, err)
		}
	}
	if got := getBody(t, "http://"+lb2+"/"); got != "b" {
		t.Fatalf("%s answered %q, want b", lb2, got)
	}
	if got := getBody(t, "http://"+la+"/"); got != "a" {
		t.Fatalf("%s answered %q, want a", la, got)
	}
}

// TestLoopKernelWait: with Options.LoopKernelWait light (the default)
// the loops wait in the kernel between requests sent one at a time
// (io_uring; the HoldP the node gives the proxy says the embedded
// RateLimitly is on the loops), with off they only park; every mode
// answers every request.
func TestLoopKernelWait(t *testing.T) {
	if err := evloop.ProbeIOUring(); err != nil {
		testkit.Missing(t, "io_uring refused on this machine: %v", err)
	}
	for _, mode := range []KernelWait{KernelWaitOff, KernelWaitLight} {
		t.Run(mode.String(), func(t *testing.T) {
			upA, upB := namedUpstream(t, "a"), namedUpstream(t, "b")
			la, lb := freeAddr(t), freeAddr(t)
			path := filepath.Join(t.TempDir(), "policy.yaml")
			writeTwoServices(t, path, la, upA, lb, upB)
			pol, err := admission.Load(path)
			if err != nil {
				t.Fatal(err)
			}
			rt := startLoadedWith(t, pol, path, func(o *Options) { o.LoopKernelWait = mode })
			// Many requests: one wait within 1 ms of a park is enough, even
			// on a loaded machine.
			for range 200 {
				if got := getBody(t, "http://"+la+"/"); got != "a" {
					t.Fatalf("%s answered %q, want a", la, got)
				}
			}
			st := rt.proxy.Stats().Loops
			if want := mode != KernelWaitOff; (st.KernelWaits > 0) != want {
				t.Fatalf("loop stats %+v with LoopKernelWait %v", st, mode)
			}
		})
	}
}

func TestParseKernelWait(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want KernelWait
		bad  bool
	}{
		{"light", KernelWaitLight, false},
		{"off", KernelWaitOff, false},
		{"always", 0, true}, // removed: no better than light
		{"", 0, true},
		{"true", 0, true},
		{"Light", 0, true},
		{"on", 0, true},
	} {
		got, err := ParseKernelWait(tc.in)
		if tc.bad {
			if err == nil {
				t.Errorf("ParseKernelWait(%q) = %v, want an error", tc.in, got)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("ParseKernelWait(%q) = %v, %v; want %v", tc.in, got, err, tc.want)
		}
		if got.String() != tc.in {
			t.Errorf("%v.String() = %q, want %q", got, got.String(), tc.in)
		}
	}
	if s := KernelWait(7).String(); s != "KernelWait(7)" {
		t.Errorf("KernelWait(7).String() = %q", s)
	}
}

// TestUpstreamDNSRefresh: Options.UpstreamDNSRefresh reaches the proxy
// as the lookup lifetime of upstream host names and survives a reload;
// a service whose upstream is named "localhost" is served through the
// loops' lookup.
func TestUpstreamDNSRefresh(t *testing.T) {
	_, port, _ := net.SplitHostPort(namedUpstream(t, "a"))
	la, lb := freeAddr(t), freeAddr(t)
	path := filepath.Join(t.TempDir(), "policy.yaml")
	writeTwoServices(t, path, la, "localhost:"+port, lb, namedUpstream(t, "b"))
	pol, err := admission.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	rt := startLoadedWith(t, pol, path, func(o *Options) { o.UpstreamDNSRefresh = 3 * time.Second })
	for i := range 2 {
		if got := getBody(t, "http://"+la+"/"); got != "a" {
			t.Fatalf("%s answered %q, want a", la, got)
		}
		if ttl := rt.proxy.Config().ResolveTTL; ttl != 3*time.Second {
			t.Fatalf("proxy ResolveTTL %v, want 3s", ttl)
		}
		if i == 0 {
			if err := rt.reloader.Reload(admission.TriggerSignal); err != nil {
				t.Fatal(err)
			}
		}
	}
	if n := rt.proxy.Stats().UpstreamLookups; n < 1 {
		t.Fatalf("%d upstream lookups, want the name looked up", n)
	}
}
