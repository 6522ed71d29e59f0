// Package netnstest creates throw-away network namespaces, veth pairs and
// bpffs mounts for tests, and runs Go code or commands inside them.
//
// Namespaces are named (ip netns add), so `ip netns exec NAME cmd` and
// NS.Command work for external programs (nginx, curl, wrk); Go code runs in
// a namespace through NS.Do, on a locked OS thread that is returned to the
// original namespace afterwards. Sockets keep the namespace they were created
// in, so a listener made inside Do can be served from any goroutine, but
// every dial or listen must happen inside Do.
package netnstest

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/rl-tproxy/rl-tproxy/internal/testkit"
)

var seq atomic.Uint64

// Require ends t (testkit.Missing: a skip, or a failure under
// RL_TPROXY_STRICT=1) unless the process is root and has the ip tool to
// create network namespaces.
func Require(t testing.TB) {
	t.Helper()
	testkit.NeedRoot(t, "creates network namespaces")
	testkit.NeedTool(t, "ip", "iproute2")
}

// NS is a named network namespace owned by a test.
type NS struct {
	Name string
	fd   int
}

// New creates a network namespace with its loopback device up and removes
// it when the test ends.
func New(t testing.TB) *NS {
	t.Helper()
	Require(t)
	name := fmt.Sprintf("rltp-%d-%d", os.Getpid(), seq.Add(1))
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add %s: %v: %s", name, err, out)
	}
	fd, err := unix.Open("/run/netns/"+name, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		_ = exec.Command("ip", "netns", "del", name).Run()
		t.Fatalf("open netns %s: %v", name, err)
	}
	ns := &NS{Name: name, fd: fd}
	t.Cleanup(func() {
		unix.Close(fd)
		if out, err := exec.Command("ip", "netns", "del", name).CombinedOutput(); err != nil {
			t.Errorf("ip netns del %s: %v: %s", name, err, out)
		}
	})
	if err := ns.linkUp("lo"); err != nil {
		t.Fatal(err)
	}
	return ns
}

// netlink returns a netlink handle that configures the namespace from any
// thread (no setns needed).
func (n *NS) netlink() (*netlink.Handle, error) {
	h, err := netlink.NewHandleAt(netns.NsHandle(n.fd))
	if err != nil {
		return nil, fmt.Errorf("netlink handle in %s: %w", n.Name, err)
	}
	return h, nil
}

func (n *NS) linkUp(dev string) error {
	h, err := n.netlink()
	if err != nil {
		return err
	}
	defer h.Close()
	l, err := h.LinkByName(dev)
	if err != nil {
		return fmt.Errorf("%s: link %s: %w", n.Name, dev, err)
	}
	if err := h.LinkSetUp(l); err != nil {
		return fmt.Errorf("%s: set %s up: %w", n.Name, dev, err)
	}
	return nil
}

// addAddrs puts a4/24 and a6/64 (no duplicate address detection, so it is
// usable at once) on dev and brings dev up.
func (n *NS) addAddrs(dev string, a4, a6 netip.Addr) error {
	h, err := n.netlink()
	if err != nil {
		return err
	}
	defer h.Close()
	l, err := h.LinkByName(dev)
	if err != nil {
		return fmt.Errorf("%s: link %s: %w", n.Name, dev, err)
	}
	for _, a := range []struct {
		p     netip.Prefix
		flags int
	}{{netip.PrefixFrom(a4, 24), 0}, {netip.PrefixFrom(a6, 64), unix.IFA_F_NODAD}} {
		addr := &netlink.Addr{IPNet: &net.IPNet{IP: a.p.Addr().AsSlice(), Mask: net.CIDRMask(a.p.Bits(), a.p.Addr().BitLen())}, Flags: a.flags}
		if err := h.AddrAdd(l, addr); err != nil {
			return fmt.Errorf("%s: add %v to %s: %w", n.Name, a.p, dev, err)
		}
	}
	if err := h.LinkSetUp(l); err != nil {
		return fmt.Errorf("%s: set %s up: %w", n.Name, dev, err)
	}
	return nil
}

// Path is the namespace's bind mount, usable with nsenter --net=PATH.
func (n *NS) Path() string { return "/run/netns/" + n.Name }

// Do runs f on an OS thread switched into the namespace and returns its
// error. The thread returns to its original namespace before it is released;
// if that fails the thread is discarded. f runs on its own goroutine: if it
// calls t.Fatal (runtime.Goexit) Do returns an error instead of hanging.
func (n *NS) Do(f func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("open current netns: %w", err)
			return
		}
		if err := unix.Setns(n.fd, unix.CLONE_NEWNET); err != nil {
			unix.Close(orig)
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("setns %s: %w", n.Name, err)
			return
		}
		ferr := fmt.Errorf("function run in %s exited its goroutine (t.Fatal inside Do?)", n.Name)
		defer func() {
			err := unix.Setns(orig, unix.CLONE_NEWNET)
			unix.Close(orig)
			if err != nil {
				// Leave the thread locked: it exits with this goroutine.
				errc <- fmt.Errorf("restore netns after %s: %w", n.Name, err)
				return
			}
			runtime.UnlockOSThread()
			errc <- ferr
		}()
		ferr = f()
	}()
	return <-errc
}

// Command returns a command that runs inside the namespace (ip netns exec).
func (n *NS) Command(ctx context.Context, name string, args ...string) *exec.Cmd {
	return exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", n.Name, name}, args...)...)
}

// IP runs `ip -n NAME args...`.
func (n *NS) IP(args ...string) error {
	out, err := exec.Command("ip", append([]string{"-n", n.Name}, args...)...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ip -n %s %s: %w: %s", n.Name, strings.Join(args, " "), err, out)
	}
	return nil
}

// MustIP is IP that fails the test on error.
func (n *NS) MustIP(t testing.TB, args ...string) {
	t.Helper()
	if err := n.IP(args...); err != nil {
		t.Fatal(err)
	}
}

// Pair is a "node" and a "client" namespace joined by a veth pair, with
// IPv4 and IPv6 (ULA, no DAD) addresses on both ends.
type Pair struct {
	Node, Client         *NS
	NodeIP4, ClientIP4   netip.Addr
	NodeIP6, ClientIP6   netip.Addr
	NodeLink, ClientLink string
}

// NewPair creates the two namespaces and the veth pair between them:
// node 10.200.0.1/24 and fd00:200::1/64, client 10.200.0.2 and fd00:200::2.
func NewPair(t testing.TB) *Pair {
	t.Helper()
	p := &Pair{
		Node:       New(t),
		Client:     New(t),
		NodeIP4:    netip.MustParseAddr("10.200.0.1"),
		ClientIP4:  netip.MustParseAddr("10.200.0.2"),
		NodeIP6:    netip.MustParseAddr("fd00:200::1"),
		ClientIP6:  netip.MustParseAddr("fd00:200::2"),
		NodeLink:   "veth-node",
		ClientLink: "veth-client",
	}
	h, err := p.Node.netlink()
	if err != nil {
		t.Fatal(err)
	}
	veth := &netlink.Veth{
		LinkAttrs:     netlink.LinkAttrs{Name: p.NodeLink},
		PeerName:      p.ClientLink,
		PeerNamespace: netlink.NsFd(p.Client.fd),
	}
	err = h.LinkAdd(veth)
	h.Close()
	if err != nil {
		t.Fatalf("add veth %s/%s: %v", p.NodeLink, p.ClientLink, err)
	}
	if err := p.Node.addAddrs(p.NodeLink, p.NodeIP4, p.NodeIP6); err != nil {
		t.Fatal(err)
	}
	if err := p.Client.addAddrs(p.ClientLink, p.ClientIP4, p.ClientIP6); err != nil {
		t.Fatal(err)
	}
	return p
}

// BPFFS mounts a private bpf filesystem in a temporary directory for the
// test and returns its path; it is unmounted when the test ends.
func BPFFS(t testing.TB) string {
	t.Helper()
	Require(t)
	dir := t.TempDir()
	if err := unix.Mount("bpf", dir, "bpf", 0, "mode=0700"); err != nil {
		testkit.Missing(t, "needs a mountable bpf filesystem: mount bpffs on %s: %v", dir, err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(dir, unix.MNT_DETACH); err != nil {
			t.Errorf("unmount bpffs %s: %v", dir, err)
		}
	})
	return dir
}
