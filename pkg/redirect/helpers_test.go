package redirect

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"

	"github.com/rl-tproxy/rl-tproxy/internal/netnstest"
	"github.com/rl-tproxy/rl-tproxy/internal/testkit"
)

// attachIn attaches the redirect inside ns with a private bpffs and closes it
// when the test ends. It ends t (testkit.Missing) when the kernel refuses BPF.
func attachIn(t *testing.T, ns *netnstest.NS, cfg Config) *Redirect {
	t.Helper()
	requireBPF(t)
	if cfg.PinRoot == "" {
		cfg.PinRoot = netnstest.BPFFS(t) + "/rl-tproxy"
	}
	var r *Redirect
	err := ns.Do(func() (err error) {
		r, err = Attach(cfg)
		return err
	})
	if err != nil {
		t.Fatalf("Attach: %v", err)
	}
	t.Cleanup(func() { r.Close() })
	return r
}

// listenTCP opens a plain TCP (MPTCP off) listener inside ns.
func listenTCP(t *testing.T, ns *netnstest.NS, network, addr string) net.Listener {
	t.Helper()
	var ln net.Listener
	err := ns.Do(func() (err error) {
		var lc net.ListenConfig
		lc.SetMultipathTCP(false)
		ln, err = lc.Listen(context.Background(), network, addr)
		return err
	})
	if err != nil {
		t.Fatalf("listen %s %s: %v", network, addr, err)
	}
	t.Cleanup(func() { ln.Close() })
	return ln
}

// serve answers every connection on ln with "name local-addr\n" and closes
// it. It stops when ln closes; the test waits for it.
func serve(t *testing.T, ln net.Listener, name string) {
	t.Helper()
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			fmt.Fprintf(c, "%s %s\n", name, c.LocalAddr())
			c.Close()
		}
	}()
	t.Cleanup(func() { ln.Close(); wg.Wait() })
}

// ask connects to addr from inside ns (with dial, or a plain dialer when nil)
// and returns the one line the server wrote.
func ask(ns *netnstest.NS, addr string, dial func(ctx context.Context, network, addr string) (net.Conn, error)) (string, error) {
	var line string
	err := ns.Do(func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if dial == nil {
			var d net.Dialer
			dial = d.DialContext
		}
		c, err := dial(ctx, "tcp", addr)
		if err != nil {
			return err
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(10 * time.Second))
		line, err = bufio.NewReader(c).ReadString('\n')
		if err != nil && !errors.Is(err, io.EOF) {
			return err
		}
		line = strings.TrimSpace(line)
		return nil
	})
	return line, err
}

func mustAsk(t *testing.T, ns *netnstest.NS, addr string, dial func(ctx context.Context, network, addr string) (net.Conn, error)) string {
	t.Helper()
	line, err := ask(ns, addr, dial)
	if err != nil {
		t.Fatalf("connect to %s from %s: %v", addr, ns.Name, err)
	}
	return line
}

// requireBPF ends t (testkit.Missing) unless this process may load an
// sk_lookup program.
func requireBPF(t testing.TB) {
	t.Helper()
	requireRoot(t)
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{
		Type:         ebpf.SkLookup,
		AttachType:   ebpf.AttachSkLookup,
		License:      "Dual BSD/GPL",
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, 1), asm.Return()},
	})
	if err != nil {
		testkit.Missing(t, "needs BPF (sk_lookup programs, CAP_BPF/CAP_NET_ADMIN): %v", err)
	}
	prog.Close()
}

func requireRoot(t testing.TB) {
	t.Helper()
	testkit.NeedRoot(t, "loads eBPF in a network namespace")
}
