package redirect

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/rl-tproxy/rl-tproxy/internal/netnstest"
	"github.com/rl-tproxy/rl-tproxy/internal/testkit"
)

// listenGroup opens n plain TCP SO_REUSEPORT listeners on addr inside ns
// (one reuseport group; a port-0 addr gets its port from the first).
func listenGroup(ns *netnstest.NS, network, addr string, n int) ([]net.Listener, error) {
	var lns []net.Listener
	err := ns.Do(func() (err error) {
		lns, err = listenGroupHere(network, addr, n)
		return err
	})
	return lns, err
}

// listenGroupHere is listenGroup in the calling thread's namespace.
func listenGroupHere(network, addr string, n int) ([]net.Listener, error) {
	lc := net.ListenConfig{Control: func(_, _ string, c syscall.RawConn) error {
		var serr error
		if err := c.Control(func(fd uintptr) {
			serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_REUSEPORT, 1)
		}); err != nil {
			return err
		}
		return serr
	}}
	lc.SetMultipathTCP(false)
	var lns []net.Listener
	for i := range n {
		ln, err := lc.Listen(context.Background(), network, addr)
		if err != nil {
			for _, l := range lns {
				l.Close()
			}
			return nil, fmt.Errorf("socket %d of the group: %w", i, err)
		}
		lns = append(lns, ln)
		addr = ln.Addr().String()
	}
	return lns, nil
}

func mustListenGroup(t *testing.T, ns *netnstest.NS, network, addr string, n int) []net.Listener {
	t.Helper()
	lns, err := listenGroup(ns, network, addr, n)
	if err != nil {
		t.Fatalf("listen group %s %s: %v", network, addr, err)
	}
	t.Cleanup(func() {
		for _, ln := range lns {
			ln.Close()
		}
	})
	return lns
}

// serveGroup answers on socket i of lns with "name local-addr i".
func serveGroup(t *testing.T, lns []net.Listener, name string) {
	t.Helper()
	var wg sync.WaitGroup
	for i, ln := range lns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				fmt.Fprintf(c, "%s %s %d\n", name, c.LocalAddr(), i)
				c.Close()
			}
		}()
	}
	t.Cleanup(func() {
		for _, ln := range lns {
			ln.Close()
		}
		wg.Wait()
	})
}

// spread asks addr from the client namespace until every socket 0..n-1 of
// the group called name answered (at most max connections), and returns
// the answers per socket. Any other answer ends t.
func spread(t *testing.T, ns *netnstest.NS, addr, name string, n, max int) map[string]int {
	t.Helper()
	by := map[string]int{}
	for range max {
		got := mustAsk(t, ns, addr, nil)
		f := strings.Fields(got)
		if len(f) != 3 || f[0] != name || f[1] != addr {
			t.Fatalf("answer %q, want %q from a socket of group %s", got, name+" "+addr+" <i>", name)
		}
		by[f[2]]++
		if len(by) == n {
			break
		}
	}
	return by
}

// TestSteerToReuseportGroup: the sockmap slot holds one socket of a
// SO_REUSEPORT group and the kernel's reuseport selection (sk_lookup
// without BPF_SK_LOOKUP_F_NO_REUSEPORT) spreads steered connections over
// every socket of the group, for IPv4 and IPv6.
func TestSteerToReuseportGroup(t *testing.T) {
	requireBPF(t)
	p := netnstest.NewPair(t)
	service := listenTCP(t, p.Node, "tcp", ":80")
	serve(t, service, "service")
	r := attachIn(t, p.Node, Config{Ports: []uint16{80}})
	const n = 4
	for _, tc := range []struct {
		network, addr string
		node          netip.Addr
	}{
		{"tcp4", "127.0.0.1:0", p.NodeIP4},
		{"tcp6", "[::1]:0", p.NodeIP6},
	} {
		target := netip.AddrPortFrom(tc.node, 80).String()
		g := mustListenGroup(t, p.Node, tc.network, tc.addr, n)
		serveGroup(t, g, "group")
		before, err := r.Counters()
		if err != nil {
			t.Fatal(err)
		}
		// The slot holds the LAST socket: selection covers the group
		// whichever member is registered.
		if err := r.RegisterListener(g[n-1]); err != nil {
			t.Fatal(err)
		}
		by := spread(t, p.Client, target, "group", n, 400)
		if len(by) != n {
			t.Fatalf("%s: answers per socket after 400 connections: %v; want all %d sockets", tc.network, by, n)
		}
		after, err := r.Counters()
		if err != nil {
			t.Fatal(err)
		}
		total := 0
		for _, k := range by {
			total += k
		}
		if got := after.Steered - before.Steered; got != uint64(total) {
			t.Errorf("%s: steered counter grew by %d for %d connections", tc.network, got, total)
		}
		t.Logf("%s: %d connections, answers per socket %v", tc.network, total, by)
	}
}

// queueLen is the number of connections waiting in ln's accept queue.
func queueLen(t *testing.T, ln net.Listener) int {
	t.Helper()
	rc, err := ln.(*net.TCPListener).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var n int
	var ierr error
	if err := rc.Control(func(fd uintptr) {
		var info *unix.TCPInfo
		info, ierr = unix.GetsockoptTCPInfo(int(fd), unix.IPPROTO_TCP, unix.TCP_INFO)
		if ierr == nil {
			n = int(info.Unacked) // a LISTEN socket's accept queue length
		}
	}); err != nil {
		t.Fatal(err)
	}
	if ierr != nil {
		t.Fatal(ierr)
	}
	return n
}

// TestGroupTakeoverKeepsQueued: connections waiting in the accept queues
// of every socket of the old group when a new group takes the slot are
// still there for the old owner to serve; new connections go to the new
// group, spread over all its sockets.
func TestGroupTakeoverKeepsQueued(t *testing.T) {
	requireBPF(t)
	p := netnstest.NewPair(t)
	node4 := netip.AddrPortFrom(p.NodeIP4, 80).String()
	service := listenTCP(t, p.Node, "tcp", ":80")
	serve(t, service, "service")
	r := attachIn(t, p.Node, Config{Ports: []uint16{80}})
	const n, queued = 4, 64

	// The old group accepts nothing yet: the connections stay queued.
	old := mustListenGroup(t, p.Node, "tcp4", "127.0.0.1:0", n)
	if err := r.RegisterListener(old[0]); err != nil {
		t.Fatal(err)
	}
	var clients []net.Conn
	t.Cleanup(func() {
		for _, c := range clients {
			c.Close()
		}
	})
	err := p.Client.Do(func() error {
		for range queued {
			c, err := net.Dial("tcp4", node4)
			if err != nil {
				return err
			}
			clients = append(clients, c)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("dial while the old group accepts nothing: %v", err)
	}
	// Dial returned after the handshake: each connection sits in the
	// accept queue of the socket reuseport selection chose.
	total := 0
	var per []int
	for _, ln := range old {
		k := queueLen(t, ln)
		per = append(per, k)
		total += k
	}
	if total != queued {
		t.Fatalf("accept queues of the old group hold %v (%d), want %d", per, total, queued)
	}
	for i, k := range per {
		if k == 0 {
			t.Fatalf("socket %d of the old group has no queued connection (%v): steering did not spread", i, per)
		}
	}

	// Takeover: the new group's socket takes the slot.
	next := mustListenGroup(t, p.Node, "tcp4", "127.0.0.1:0", n)
	serveGroup(t, next, "next")
	if err := r.RegisterListener(next[2]); err != nil {
		t.Fatal(err)
	}
	if on, err := r.ListenerRegistered(old[0]); err != nil || on {
		t.Fatalf("old group still registered after takeover: %v %v", on, err)
	}
	if by := spread(t, p.Client, node4, "next", n, 400); len(by) != n {
		t.Fatalf("after takeover, answers per socket of the new group: %v; want all %d", by, n)
	}

	// The old owner drains every socket of its group: nothing was lost.
	served := 0
	for i, ln := range old {
		conns, err := AcceptQueued(ln)
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range conns {
			fmt.Fprintf(c, "old %s %d\n", c.LocalAddr(), i)
			c.Close()
			served++
		}
		if k := queueLen(t, ln); k != 0 {
			t.Errorf("socket %d still has %d queued after the drain", i, k)
		}
	}
	if served != queued {
		t.Fatalf("drained %d queued connections from the old group, want %d", served, queued)
	}
	for i, c := range clients {
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
		buf := make([]byte, 128)
		k, err := c.Read(buf)
		if err != nil || !strings.HasPrefix(string(buf[:k]), "old "+node4+" ") {
			t.Fatalf("queued client %d: %q %v", i, buf[:k], err)
		}
	}
	for _, ln := range old {
		ln.Close()
	}
	if by := spread(t, p.Client, node4, "next", n, 400); len(by) != n {
		t.Fatalf("after the old group closed: %v", by)
	}
}

// TestProcessGroupTakeover: a real proxy process serving a SO_REUSEPORT
// group of 4 sockets is taken over, under a sequential client load, by
// another process with its own group; the old one drains every socket of
// its group and exits. No connection fails or is refused (none is killed
// here), the new group serves on all its sockets, and the old one served
// on all of its.
func TestProcessGroupTakeover(t *testing.T) {
	requireBPF(t)
	p := netnstest.NewPair(t)
	root := netnstest.BPFFS(t) + "/rl-tproxy"
	node4 := netip.AddrPortFrom(p.NodeIP4, 80).String()
	service := listenTCP(t, p.Node, "tcp", ":80")
	serve(t, service, "service")
	const n = 4

	a := startHelper(t, p.Node, root, "A", fmt.Sprintf("RLTP_GROUP=%d", n))
	if by := spread(t, p.Client, node4, "A", n, 400); len(by) != n {
		t.Fatalf("group A answered on %v, want all %d sockets", by, n)
	}
	stop := make(chan struct{})
	var ready atomic.Bool
	var progress atomic.Int64
	results := runLoad(p, node4, stop, 200000, &ready, &progress)
	waitMore := func(what string, k int64) {
		base := progress.Load()
		testkit.WaitWithin(t, 30*time.Second, fmt.Sprintf("%d more answers (%s)", k, what), func() bool { return progress.Load() >= base+k })
	}
	waitMore("load through A", 50)

	c := startHelper(t, p.Node, root, "C", fmt.Sprintf("RLTP_GROUP=%d", n))
	// C's first socket is in the slot: every connection dialled from here
	// on goes to C's group.
	ready.Store(true)
	waitMore("load after the takeover", 50)
	if got := a.registered(t); got != "registered=false err=<nil>" {
		t.Fatalf("A after takeover: %s", got)
	}
	a.stdin.Close() // drain every socket of A's group, exit
	if err := a.cmd.Wait(); err != nil {
		t.Fatalf("A exit: %v", err)
	}
	waitMore("load after A exited", 50)
	close(stop)
	res := <-results
	t.Logf("load: %d connections, %d answered %v, %d refused, %d failed, %d of them after C was ready (first: %v)",
		res.total, res.completed, res.by, res.refused, res.failed, res.failedAfterKill, res.firstFailure)
	if res.refused != 0 || res.failed != 0 {
		t.Errorf("takeover of a group: %d refused, %d failed (%d started after the new group was ready), want none; first failure %v",
			res.refused, res.failed, res.failedAfterKill, res.firstFailure)
	}
	if res.by["A"] == 0 || res.by["C"] == 0 || res.by["service"] != 0 {
		t.Errorf("answers by %v: want A before the takeover, C after, never the service", res.by)
	}
	if by := spread(t, p.Client, node4, "C", n, 400); len(by) != n {
		t.Fatalf("group C answered on %v, want all %d sockets", by, n)
	}
	if got := c.registered(t); got != "registered=true err=<nil>" {
		t.Fatalf("C: %s", got)
	}
}
