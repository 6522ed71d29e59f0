package netnstest

import (
	"context"
	"net"
	"net/netip"
	"os"
	"runtime"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

func nsInode(t *testing.T) uint64 {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Stat("/proc/thread-self/ns/net", &st); err != nil {
		t.Fatal(err)
	}
	return st.Ino
}

func TestPairConnectsBothFamilies(t *testing.T) {
	p := NewPair(t)
	for _, node := range []netip.Addr{p.NodeIP4, p.NodeIP6} {
		var ln net.Listener
		if err := p.Node.Do(func() (err error) {
			ln, err = net.Listen("tcp", netip.AddrPortFrom(node, 0).String())
			return err
		}); err != nil {
			t.Fatal(err)
		}
		accepted := make(chan net.Addr, 1)
		go func() {
			c, err := ln.Accept()
			if err != nil {
				accepted <- nil
				return
			}
			accepted <- c.RemoteAddr()
			c.Close()
		}()
		if err := p.Client.Do(func() error {
			c, err := net.Dial("tcp", ln.Addr().String())
			if err != nil {
				return err
			}
			return c.Close()
		}); err != nil {
			t.Fatalf("dial %v from the client namespace: %v", ln.Addr(), err)
		}
		remote := <-accepted
		ln.Close()
		if remote == nil {
			t.Fatal("accept failed")
		}
		want := p.ClientIP4
		if node.Is6() {
			want = p.ClientIP6
		}
		if got := remote.(*net.TCPAddr).AddrPort().Addr(); got != want {
			t.Errorf("peer address %v, want %v", got, want)
		}
	}
}

func TestDoRestoresNamespaceAndCommandRunsInside(t *testing.T) {
	ns := New(t)
	before := nsInode(t)
	var inside uint64
	if err := ns.Do(func() error { inside = nsInode(t); return nil }); err != nil {
		t.Fatal(err)
	}
	if inside == before {
		t.Fatal("Do ran in the caller's namespace")
	}
	// Do runs on another goroutine; a second Do gets the same namespace.
	var again uint64
	_ = ns.Do(func() error { again = nsInode(t); return nil })
	if again != inside {
		t.Errorf("namespace inode changed between Do calls: %d then %d", inside, again)
	}
	out, err := ns.Command(context.Background(), "readlink", "/proc/self/ns/net").Output()
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(out), strconv.FormatUint(inside, 10)) {
		t.Errorf("command ran in %q, want inode %d", out, inside)
	}
	if _, err := os.Stat(ns.Path()); err != nil {
		t.Errorf("namespace path: %v", err)
	}
}

func TestBPFFSIsBPF(t *testing.T) {
	dir := BPFFS(t)
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		t.Fatal(err)
	}
	if uint32(st.Type) != uint32(unix.BPF_FS_MAGIC) {
		t.Fatalf("%s has fs type %#x, want bpffs", dir, st.Type)
	}
}

func TestDoSurvivesGoexit(t *testing.T) {
	ns := New(t)
	before := nsInode(t)
	err := ns.Do(func() error {
		runtime.Goexit()
		return nil
	})
	if err == nil {
		t.Fatal("Do returned nil after its function called Goexit")
	}
	if after := nsInode(t); after != before {
		t.Fatalf("test goroutine's namespace changed: %d -> %d", before, after)
	}
}
