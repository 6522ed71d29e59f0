package redirect

import (
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"

	"github.com/rl-tproxy/rl-tproxy/bpf"
	"github.com/rl-tproxy/rl-tproxy/internal/netnstest"
	"github.com/rl-tproxy/rl-tproxy/internal/testkit"
)

// statusIn runs Status inside ns.
func statusIn(t *testing.T, ns *netnstest.NS, root string) *State {
	t.Helper()
	var st *State
	if err := ns.Do(func() (err error) { st, err = Status(root); return err }); err != nil {
		t.Fatalf("Status: %v", err)
	}
	return st
}

// foreignProgram replaces the program of the pinned link with a different
// sk_lookup program, as an older or newer build would have left it.
func foreignProgram(t *testing.T, dir string) {
	t.Helper()
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{
		Type:       ebpf.SkLookup,
		AttachType: ebpf.AttachSkLookup,
		License:    "Dual BSD/GPL",
		Instructions: asm.Instructions{
			asm.Mov.Imm(asm.R0, 1), // SK_PASS
			asm.Return(),
		},
	})
	if err != nil {
		t.Fatalf("load foreign program: %v", err)
	}
	defer prog.Close()
	l, err := link.LoadPinnedLink(filepath.Join(dir, pinLink), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if err := l.Update(prog); err != nil {
		t.Fatalf("swap in foreign program: %v", err)
	}
}

func TestPinReuseUpgradeDetach(t *testing.T) {
	requireRoot(t)
	ns := netnstest.New(t)
	root := netnstest.BPFFS(t) + "/rl-tproxy"
	cfg := Config{PinRoot: root, Ports: []uint16{80}, Prefixes: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}}

	st := statusIn(t, ns, root)
	if st.Pinned {
		t.Fatalf("fresh bpffs: Status says pinned: %+v", st)
	}

	r1 := attachIn(t, ns, cfg)
	ln := listenTCP(t, ns, "tcp4", "127.0.0.1:0")
	if err := r1.RegisterListener(ln); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{pinLink, pinProgram, pinMapPfx + "sockets", pinMapPfx + "steer_ports", pinMapPfx + "bypass", pinMapPfx + "counters"} {
		if _, err := os.Stat(filepath.Join(r1.Dir(), name)); err != nil {
			t.Errorf("pin %s: %v", name, err)
		}
	}
	st1 := statusIn(t, ns, root)
	if !st1.Pinned || !st1.MatchesBinary || st1.ProgramTag == "" {
		t.Fatalf("after Attach: %+v", st1)
	}
	if !slices.Equal(st1.Ports, []uint16{80}) || len(st1.Prefixes) != 1 || st1.Prefixes[0].String() != "10.0.0.0/8" {
		t.Errorf("status ports/prefixes = %v %v", st1.Ports, st1.Prefixes)
	}
	if !st1.Sockets[0].Present || st1.Sockets[0].Cookie != cookieOf(t, ln) || st1.Sockets[1].Present {
		t.Errorf("status sockets = %+v, want IPv4 slot with cookie %d", st1.Sockets, cookieOf(t, ln))
	}
	r1.Close()

	// A second Attach (a restarted proxy) reuses the pinned program and
	// maps: same program, listener still in the sockmap, ports rewritten.
	cfg.Ports = []uint16{80, 8080}
	r2 := attachIn(t, ns, cfg)
	st2 := statusIn(t, ns, root)
	if st2.ProgramID != st1.ProgramID || st2.LinkID != st1.LinkID {
		t.Errorf("reattach changed program/link: %d/%d -> %d/%d", st1.ProgramID, st1.LinkID, st2.ProgramID, st2.LinkID)
	}
	if !st2.Sockets[0].Present || st2.Sockets[0].Cookie != st1.Sockets[0].Cookie {
		t.Errorf("reattach lost the sockmap entry: %+v", st2.Sockets)
	}
	if !slices.Equal(st2.Ports, []uint16{80, 8080}) {
		t.Errorf("ports after reattach = %v", st2.Ports)
	}
	if err := r2.Check(); err != nil {
		t.Errorf("Check after reattach: %v", err)
	}

	// Another build's program is refused without Upgrade...
	foreignProgram(t, st1.Dir)
	if err := r2.Check(); err == nil {
		t.Error("Check passes while the link runs another program")
	}
	err := ns.Do(func() error {
		r, err := Attach(cfg)
		if err == nil {
			r.Close()
		}
		return err
	})
	if !errors.Is(err, ErrIncompatible) {
		t.Fatalf("Attach over a foreign program: err = %v, want ErrIncompatible", err)
	}
	if st := statusIn(t, ns, root); st.MatchesBinary {
		t.Errorf("status claims the foreign program matches: %+v", st)
	}

	// ...and replaced in place through the link with Upgrade, keeping the
	// compatible maps (the listener stays registered).
	cfg.Upgrade = true
	r3 := attachIn(t, ns, cfg)
	if !r3.Upgraded() || r2.Upgraded() {
		t.Errorf("Upgraded: %v after the upgrade, %v after a reuse; want true, false", r3.Upgraded(), r2.Upgraded())
	}
	st3 := statusIn(t, ns, root)
	if !st3.MatchesBinary || st3.LinkID != st1.LinkID {
		t.Errorf("after upgrade: %+v (link before %d)", st3, st1.LinkID)
	}
	if !st3.Sockets[0].Present || st3.Sockets[0].Cookie != st1.Sockets[0].Cookie {
		t.Errorf("upgrade lost the sockmap entry: %+v", st3.Sockets)
	}
	// The upgraded program really runs: a steered lookup selects the listener.
	ap := netip.MustParseAddrPort
	if _, cookie, _ := run(t, r3, lookupCtx(6, ap("10.1.0.2:5000"), ap("10.1.0.1:8080"))); cookie != st1.Sockets[0].Cookie {
		t.Errorf("upgraded program selected %d, want %d", cookie, st1.Sockets[0].Cookie)
	}
	r3.Close()

	// Detach removes link and pins; a second Detach says not attached.
	if err := ns.Do(func() error { return Detach(root) }); err != nil {
		t.Fatalf("Detach: %v", err)
	}
	if _, err := os.Stat(st1.Dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("pin directory still there after Detach: %v", err)
	}
	if st := statusIn(t, ns, root); st.Pinned {
		t.Errorf("Status after Detach: %+v", st)
	}
	if _, err := link.NewFromID(link.ID(st1.LinkID)); err == nil {
		t.Errorf("link %d still exists after Detach", st1.LinkID)
	}
	if err := ns.Do(func() error { return Detach(root) }); !errors.Is(err, ErrNotAttached) {
		t.Errorf("second Detach: %v, want ErrNotAttached", err)
	}
}

func TestAttachRefusesNonBPFFS(t *testing.T) {
	requireRoot(t)
	ns := netnstest.New(t)
	dir := t.TempDir() // tmpfs or disk, not bpffs
	err := ns.Do(func() error {
		r, err := Attach(Config{PinRoot: dir})
		if err == nil {
			r.Close()
		}
		return err
	})
	if !errors.Is(err, ErrNoBPFFS) {
		t.Fatalf("Attach on %s: %v, want ErrNoBPFFS", dir, err)
	}
	var st *State
	if err := ns.Do(func() (err error) { st, err = Status(dir); return err }); err != nil || st.Pinned || st.Reason == "" {
		t.Fatalf("Status on non-bpffs: %+v %v", st, err)
	}
}

func TestConfigValidation(t *testing.T) {
	for _, cfg := range []Config{
		{Ports: []uint16{0}},
		{Prefixes: []netip.Prefix{{}}},
	} {
		if err := validate(cfg); err == nil {
			t.Errorf("validate(%+v) = nil, want error", cfg)
		}
	}
	if err := validate(Config{Ports: []uint16{80}}); err != nil {
		t.Errorf("validate: %v", err)
	}
}

// Pins left by a namespace that no longer exists (its inode number reused
// by a new namespace) are recognised as stale: Status says not attached and
// Attach starts over instead of trusting a link that steers nothing.
func TestStalePinsFromAnotherNamespace(t *testing.T) {
	requireRoot(t)
	a, b := netnstest.New(t), netnstest.New(t)
	root := netnstest.BPFFS(t) + "/rl-tproxy"
	ra := attachIn(t, a, Config{PinRoot: root, Ports: []uint16{80}})
	ra.Close()
	var dirB string
	if err := b.Do(func() (err error) { dirB, _, err = stateDir(root); return err }); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(ra.Dir(), dirB); err != nil {
		t.Fatal(err)
	}
	st := statusIn(t, b, root)
	if st.Pinned || !strings.Contains(st.Reason, "stale") {
		t.Fatalf("status of stale pins: %+v", st)
	}
	rb := attachIn(t, b, Config{PinRoot: root, Ports: []uint16{80}})
	stb := statusIn(t, b, root)
	if !stb.Pinned || stb.Dir != rb.Dir() {
		t.Fatalf("attach over stale pins: %+v", stb)
	}
}

// Concurrent Attach calls in one namespace (two proxies starting together)
// serialise on the directory flock and end with one link, shared by all.
func TestConcurrentAttachSharesOneLink(t *testing.T) {
	requireBPF(t)
	ns := netnstest.New(t)
	root := netnstest.BPFFS(t) + "/rl-tproxy"
	const n = 4
	errs := make(chan error, n)
	rs := make(chan *Redirect, n)
	for range n {
		go func() {
			errs <- ns.Do(func() error {
				r, err := Attach(Config{PinRoot: root, Ports: []uint16{80}})
				if err == nil {
					rs <- r
				}
				return err
			})
		}()
	}
	for range n {
		if err := <-errs; err != nil {
			t.Errorf("concurrent Attach: %v", err)
		}
	}
	close(rs)
	tags := map[string]bool{}
	for r := range rs {
		tags[r.ProgramTag()] = true
		r.Close()
	}
	st := statusIn(t, ns, root)
	if !st.Pinned || len(tags) != 1 {
		t.Fatalf("after concurrent attach: status %+v, tags %v", st, tags)
	}
	var progs int
	it := link.Iterator{}
	for it.Next() {
		if info, err := it.Link.Info(); err == nil && info.Type == link.NetNsType {
			if ni := info.NetNs(); ni != nil && uint64(ni.NetnsInode) == st.NetnsInode&0xffffffff {
				progs++
			}
		}
	}
	if progs != 1 {
		t.Errorf("%d sk_lookup links in the namespace, want 1", progs)
	}
}

func TestEnsureBPFFS(t *testing.T) {
	requireRoot(t)
	dir := t.TempDir() + "/bpf"
	if err := EnsureBPFFS(dir); err != nil {
		testkit.Missing(t, "needs a mountable bpffs: %v", err)
	}
	t.Cleanup(func() { _ = unix.Unmount(dir, unix.MNT_DETACH) })
	if ok, err := isBPFFS(dir); err != nil || !ok {
		t.Fatalf("after EnsureBPFFS: bpffs=%v err=%v", ok, err)
	}
	// A second call is a no-op (no stacked mount).
	if err := EnsureBPFFS(dir); err != nil {
		t.Fatal(err)
	}
	if err := unix.Unmount(dir, 0); err != nil {
		t.Fatal(err)
	}
	if ok, _ := isBPFFS(dir); ok {
		t.Error("two bpffs mounts stacked on one directory")
	}
}

// A pinned map that the attached program does not use (pins swapped under
// it) is not silently trusted: Attach refuses, Upgrade repairs.
func TestSwappedMapPinRefused(t *testing.T) {
	requireBPF(t)
	ns := netnstest.New(t)
	root := netnstest.BPFFS(t) + "/rl-tproxy"
	r := attachIn(t, ns, Config{PinRoot: root, Ports: []uint16{80}})
	dir := r.Dir()
	r.Close()
	spec, err := bpf.LoadSkLookup()
	if err != nil {
		t.Fatal(err)
	}
	m, err := ebpf.NewMap(spec.Maps[bpf.SkLookupMapSteerPorts])
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	pin := filepath.Join(dir, pinMapPfx+bpf.SkLookupMapSteerPorts)
	if err := os.Remove(pin); err != nil {
		t.Fatal(err)
	}
	if err := m.Pin(pin); err != nil {
		t.Fatal(err)
	}
	err = ns.Do(func() error {
		r, err := Attach(Config{PinRoot: root, Ports: []uint16{80}})
		if err == nil {
			r.Close()
		}
		return err
	})
	if !errors.Is(err, ErrIncompatible) || !strings.Contains(err.Error(), "not the one the attached program uses") {
		t.Fatalf("Attach with a swapped map pin: %v", err)
	}
	r2 := attachIn(t, ns, Config{PinRoot: root, Ports: []uint16{80}, Upgrade: true})
	r2.Close()
	r3 := attachIn(t, ns, Config{PinRoot: root, Ports: []uint16{80}})
	_ = r3
}
