package redirect

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"sync"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"

	"github.com/rl-tproxy/rl-tproxy/bpf"
)

// Errors callers can test with errors.Is.
var (
	// ErrIncompatible: the pinned program (or a pinned map) differs from the
	// one embedded in this binary and Config.Upgrade was not set.
	ErrIncompatible = errors.New("pinned redirect differs from this binary")
	// ErrNoBPFFS: the pin root is not on a bpf filesystem.
	ErrNoBPFFS = errors.New("not a bpf filesystem")
	// ErrNotAttached: nothing is pinned for this network namespace.
	ErrNotAttached = errors.New("redirect not attached")

	errStaleLink = errors.New("pinned link is not attached to this network namespace")
)

// Sockmap slots, as the program reads them.
const (
	SlotIPv4 uint32 = 0
	SlotIPv6 uint32 = 1
)

// Bits of the program's config flags.
const (
	flagSteerLoopback uint32 = 1 << 0
	flagFilterDst     uint32 = 1 << 1
)

// Config says what to steer. The zero value steers nothing into the default
// pin root.
type Config struct {
	// PinRoot is the bpffs directory; the state lives in PinRoot/<netns inode>/.
	// Empty means DefaultPinRoot.
	PinRoot string
	// Ports are the destination ports steered to the proxy (host order).
	Ports []uint16
	// Prefixes, when not empty, restrict steering to these destination
	// prefixes (IPv4 and IPv6 together: an IPv6 connection is steered only
	// if some IPv6 prefix contains its destination). Empty means any.
	Prefixes []netip.Prefix
	// SteerLoopback steers connections from local clients (arriving on the
	// loopback device or aimed at a loopback address) too.
	SteerLoopback bool
	// Upgrade replaces a pinned program that differs from the embedded one
	// through the pinned link; without it Attach refuses with ErrIncompatible.
	Upgrade bool
}

// Redirect is the attached steering state of one network namespace. Its
// methods are safe for concurrent use.
type Redirect struct {
	dir  string
	ino  uint64
	tag  string
	prog *ebpf.Program
	maps bpf.SkLookupMaps

	upgraded bool // Attach replaced a pinned program of another build

	mu     sync.Mutex // serialises map rewrites (ports, prefixes, flags)
	closed bool
}

// Attach loads the embedded program, or reuses the pinned one, in the
// calling thread's network namespace, and applies cfg's ports, prefixes and
// loopback policy. See the package documentation.
func Attach(cfg Config) (*Redirect, error) {
	if err := validate(cfg); err != nil {
		return nil, err
	}
	root := cfg.PinRoot
	if root == "" {
		root = DefaultPinRoot
	}
	if err := checkBPFFS(root); err != nil {
		return nil, err
	}
	dir, ino, err := stateDir(root)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("create pin directory %s: %w", dir, err)
	}
	unlock, err := lockDir(dir)
	if err != nil {
		return nil, err
	}
	defer unlock()

	spec, err := bpf.LoadSkLookup()
	if err != nil {
		return nil, fmt.Errorf("load embedded sk_lookup object: %w", err)
	}
	r := &Redirect{dir: dir, ino: ino}
	if exists(filepath.Join(dir, pinLink)) {
		err = r.reuse(spec, cfg.Upgrade)
		if errors.Is(err, errStaleLink) {
			// The namespace that inode named is gone (inodes are reused):
			// its pins steer nothing, start over.
			err = r.fresh(spec)
		}
	} else {
		err = r.fresh(spec)
	}
	if err != nil {
		return nil, err
	}
	if err := r.apply(cfg); err != nil {
		r.Close()
		return nil, err
	}
	return r, nil
}

func validate(cfg Config) error {
	for _, p := range cfg.Ports {
		if p == 0 {
			return fmt.Errorf("redirect config: port 0 cannot be steered")
		}
	}
	for _, p := range cfg.Prefixes {
		if !p.IsValid() {
			return fmt.Errorf("redirect config: invalid prefix %v", p)
		}
	}
	return nil
}

// fresh loads a new collection, pins its maps and program, attaches it to
// the namespace and pins the link. Leftover pins without a link are removed.
func (r *Redirect) fresh(spec *ebpf.CollectionSpec) (err error) {
	if err := removePins(r.dir); err != nil {
		return fmt.Errorf("remove stale pins: %w", err)
	}
	var objs bpf.SkLookupObjects
	if err := spec.LoadAndAssign(&objs, nil); err != nil {
		return fmt.Errorf("load sk_lookup program: %w", err)
	}
	defer func() {
		if err != nil {
			objs.Close()
			_ = removePins(r.dir)
		}
	}()
	for name, m := range mapsByName(&objs.SkLookupMaps) {
		if err := m.Pin(filepath.Join(r.dir, pinMapPfx+name)); err != nil {
			return fmt.Errorf("pin map %s: %w", name, err)
		}
	}
	if err := objs.Steer.Pin(filepath.Join(r.dir, pinProgram)); err != nil {
		return fmt.Errorf("pin program: %w", err)
	}
	nsFD, err := unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open network namespace: %w", err)
	}
	defer unix.Close(nsFD)
	l, err := link.AttachNetNs(nsFD, objs.Steer)
	if err != nil {
		return fmt.Errorf("attach sk_lookup to network namespace: %w", err)
	}
	defer l.Close()
	if err := l.Pin(filepath.Join(r.dir, pinLink)); err != nil {
		_ = l.Detach()
		return fmt.Errorf("pin link: %w", err)
	}
	r.prog = objs.Steer
	r.maps = objs.SkLookupMaps
	r.tag = progTag(objs.Steer)
	return nil
}

// reuse opens the pinned link, program and maps. When they match the
// embedded object it keeps them; otherwise it upgrades in place when
// allowed, or refuses.
func (r *Redirect) reuse(spec *ebpf.CollectionSpec, upgrade bool) error {
	l, err := link.LoadPinnedLink(filepath.Join(r.dir, pinLink), nil)
	if err != nil {
		return fmt.Errorf("load pinned link in %s: %w", r.dir, err)
	}
	defer l.Close()
	linfo, err := l.Info()
	if err != nil {
		return fmt.Errorf("pinned link info: %w", err)
	}
	if ns := linfo.NetNs(); ns == nil || uint64(ns.NetnsInode) != r.ino&0xffffffff {
		return errStaleLink
	}
	// The pinned program, not NewProgramFromID: getting a program by id
	// needs CAP_SYS_ADMIN, opening a pin only CAP_BPF.
	var problems []string
	prog, err := ebpf.LoadPinnedProgram(filepath.Join(r.dir, pinProgram), nil)
	var pinfo *ebpf.ProgramInfo
	if err == nil {
		pinfo, err = prog.Info()
		if err != nil {
			prog.Close()
			prog = nil
		}
	}
	switch {
	case err != nil:
		problems = append(problems, fmt.Sprintf("pinned program: %v", err))
	case !samePinned(pinfo, linfo.Program):
		problems = append(problems, fmt.Sprintf("pinned program is not the one attached (link runs program %d)", linfo.Program))
	default:
		if err := spec.Programs[bpf.SkLookupProgSteer].Compatible(pinfo); err != nil {
			problems = append(problems, fmt.Sprintf("program tag %s differs from the embedded program", pinfo.Tag))
		}
	}

	compatible, mapProblems := r.pinnedMaps(spec)
	problems = append(problems, mapProblems...)
	closeMaps := func() {
		for _, m := range compatible {
			m.Close()
		}
	}
	if len(problems) == 0 {
		problems = mapsNotUsed(pinfo, compatible)
	}
	slices.Sort(problems)
	if len(problems) == 0 {
		r.prog = prog
		r.tag = pinfo.Tag
		assignMaps(&r.maps, compatible)
		return nil
	}
	if prog != nil {
		prog.Close()
	}
	if !upgrade {
		closeMaps()
		return fmt.Errorf("%w: %s: %v; start with upgrade enabled to replace it in place, or run 'rl-tproxy redirect detach'",
			ErrIncompatible, r.dir, problems)
	}

	err = r.upgrade(spec, l, compatible)
	closeMaps() // the upgraded collection holds its own references
	return err
}

// pinnedMaps opens every pinned map that is still compatible with spec and
// describes the others.
func (r *Redirect) pinnedMaps(spec *ebpf.CollectionSpec) (map[string]*ebpf.Map, []string) {
	compatible := map[string]*ebpf.Map{}
	var problems []string
	for name, ms := range spec.Maps {
		m, err := ebpf.LoadPinnedMap(filepath.Join(r.dir, pinMapPfx+name), nil)
		if err != nil {
			problems = append(problems, fmt.Sprintf("map %s: %v", name, err))
			continue
		}
		if err := ms.Compatible(m); err != nil {
			m.Close()
			problems = append(problems, fmt.Sprintf("map %s: %v", name, err))
			continue
		}
		compatible[name] = m
	}
	return compatible, problems
}

// mapsNotUsed describes the pinned maps that are not the ones the attached
// program really uses.
func mapsNotUsed(pinfo *ebpf.ProgramInfo, pinned map[string]*ebpf.Map) []string {
	ids, ok := pinfo.MapIDs()
	if !ok {
		return nil
	}
	used := map[ebpf.MapID]bool{}
	for _, id := range ids {
		used[id] = true
	}
	var problems []string
	for name, m := range pinned {
		info, err := m.Info()
		if err != nil {
			problems = append(problems, fmt.Sprintf("map %s: %v", name, err))
			continue
		}
		if id, ok := info.ID(); ok && !used[id] {
			problems = append(problems, fmt.Sprintf("pinned map %s is not the one the attached program uses", name))
		}
	}
	return problems
}

// upgrade loads the embedded program with every compatible pinned map,
// swaps it into the pinned link l, then re-pins what changed. The caller
// keeps (and closes) its references to compatible.
func (r *Redirect) upgrade(spec *ebpf.CollectionSpec, l link.Link, compatible map[string]*ebpf.Map) error {
	var objs bpf.SkLookupObjects
	err := spec.LoadAndAssign(&objs, &ebpf.CollectionOptions{MapReplacements: compatible})
	if err != nil {
		return fmt.Errorf("load upgraded sk_lookup program: %w", err)
	}
	for name, m := range mapsByName(&objs.SkLookupMaps) {
		if _, reused := compatible[name]; reused {
			continue
		}
		if err := replacePin(filepath.Join(r.dir, pinMapPfx+name), m.Pin); err != nil {
			objs.Close()
			return fmt.Errorf("pin upgraded map %s: %w", name, err)
		}
	}
	if err := l.Update(objs.Steer); err != nil {
		objs.Close()
		return fmt.Errorf("upgrade pinned link with the new program: %w", err)
	}
	if err := replacePin(filepath.Join(r.dir, pinProgram), objs.Steer.Pin); err != nil {
		objs.Close()
		return fmt.Errorf("pin upgraded program: %w", err)
	}
	r.prog = objs.Steer
	r.maps = objs.SkLookupMaps
	r.tag = progTag(objs.Steer)
	r.upgraded = true
	return nil
}

// samePinned reports whether the pinned program is the link's program.
func samePinned(pinfo *ebpf.ProgramInfo, attached ebpf.ProgramID) bool {
	id, ok := pinfo.ID()
	return ok && id == attached
}

func progTag(p *ebpf.Program) string {
	info, err := p.Info()
	if err != nil {
		return ""
	}
	return info.Tag
}

func mapsByName(m *bpf.SkLookupMaps) map[string]*ebpf.Map {
	return map[string]*ebpf.Map{
		bpf.SkLookupMapBypass:       m.Bypass,
		bpf.SkLookupMapCounters:     m.Counters,
		bpf.SkLookupMapDstPrefixes4: m.DstPrefixes4,
		bpf.SkLookupMapDstPrefixes6: m.DstPrefixes6,
		bpf.SkLookupMapSettings:     m.Settings,
		bpf.SkLookupMapSockets:      m.Sockets,
		bpf.SkLookupMapSteerPorts:   m.SteerPorts,
	}
}

func assignMaps(dst *bpf.SkLookupMaps, byName map[string]*ebpf.Map) {
	dst.Bypass = byName[bpf.SkLookupMapBypass]
	dst.Counters = byName[bpf.SkLookupMapCounters]
	dst.DstPrefixes4 = byName[bpf.SkLookupMapDstPrefixes4]
	dst.DstPrefixes6 = byName[bpf.SkLookupMapDstPrefixes6]
	dst.Settings = byName[bpf.SkLookupMapSettings]
	dst.Sockets = byName[bpf.SkLookupMapSockets]
	dst.SteerPorts = byName[bpf.SkLookupMapSteerPorts]
}

// Dir returns the pin directory, PinRoot/<netns inode>.
func (r *Redirect) Dir() string { return r.dir }

// ProgramTag returns the kernel tag of the attached program.
func (r *Redirect) ProgramTag() string { return r.tag }

// Upgraded reports whether Attach replaced a pinned program (or maps) of
// another build in place (Config.Upgrade).
func (r *Redirect) Upgraded() bool { return r.upgraded }

// apply writes cfg's ports, prefixes and loopback policy.
func (r *Redirect) apply(cfg Config) error {
	if err := r.SetPrefixes(cfg.Prefixes); err != nil {
		return err
	}
	if err := r.SetSteerLoopback(cfg.SteerLoopback); err != nil {
		return err
	}
	return r.SetPorts(cfg.Ports)
}

// Reload applies cfg's ports, prefixes and loopback policy to the attached
// program (PinRoot and Upgrade are ignored): the live-reload entry point.
func (r *Redirect) Reload(cfg Config) error {
	if err := validate(cfg); err != nil {
		return err
	}
	return r.apply(cfg)
}

// SetPorts makes ports the exact set of steered destination ports. New
// ports are added before stale ones are removed, so a port in both the old
// and the new set is never unsteered.
func (r *Redirect) SetPorts(ports []uint16) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	want := map[uint16]bool{}
	for _, p := range ports {
		if p == 0 {
			return fmt.Errorf("set steered ports: port 0 cannot be steered")
		}
		want[p] = true
	}
	one := uint8(1)
	for p := range want {
		if err := r.maps.SteerPorts.Update(p, one, ebpf.UpdateAny); err != nil {
			return fmt.Errorf("steer port %d: %w", p, err)
		}
	}
	have, err := listPorts(r.maps.SteerPorts)
	if err != nil {
		return err
	}
	for _, p := range have {
		if !want[p] {
			if err := r.maps.SteerPorts.Delete(p); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
				return fmt.Errorf("unsteer port %d: %w", p, err)
			}
		}
	}
	return nil
}

func listPorts(m *ebpf.Map) ([]uint16, error) {
	var (
		out []uint16
		k   uint16
		v   uint8
	)
	it := m.Iterate()
	for it.Next(&k, &v) {
		out = append(out, k)
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("list steered ports: %w", err)
	}
	slices.Sort(out)
	return out, nil
}

// SetPrefixes makes prefixes the exact destination filter; empty means
// every destination. The filter flag is raised only after the prefixes are
// in place and dropped before they are removed.
func (r *Redirect) SetPrefixes(prefixes []netip.Prefix) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	want4 := map[bpf.SkLookupLpmKey4]bool{}
	want6 := map[bpf.SkLookupLpmKey6]bool{}
	for _, p := range prefixes {
		if !p.IsValid() {
			return fmt.Errorf("set prefixes: invalid prefix %v", p)
		}
		p = p.Masked()
		if p.Addr().Is4() || p.Addr().Is4In6() {
			bits := p.Bits()
			if p.Addr().Is4In6() {
				bits -= 96
				if bits < 0 {
					return fmt.Errorf("set prefixes: %v is shorter than ::ffff:0:0/96", p)
				}
			}
			want4[lpm4(p.Addr().Unmap(), bits)] = true
		} else {
			want6[lpm6(p.Addr(), p.Bits())] = true
		}
	}
	one := uint8(1)
	for k := range want4 {
		if err := r.maps.DstPrefixes4.Update(k, one, ebpf.UpdateAny); err != nil {
			return fmt.Errorf("add prefix: %w", err)
		}
	}
	for k := range want6 {
		if err := r.maps.DstPrefixes6.Update(k, one, ebpf.UpdateAny); err != nil {
			return fmt.Errorf("add prefix: %w", err)
		}
	}
	if len(prefixes) > 0 {
		if err := r.setFlag(flagFilterDst, true); err != nil {
			return err
		}
	} else if err := r.setFlag(flagFilterDst, false); err != nil {
		return err
	}
	if err := deleteOthers(r.maps.DstPrefixes4, want4); err != nil {
		return err
	}
	return deleteOthers(r.maps.DstPrefixes6, want6)
}

func deleteOthers[K comparable](m *ebpf.Map, want map[K]bool) error {
	var (
		k    K
		v    uint8
		drop []K
	)
	it := m.Iterate()
	for it.Next(&k, &v) {
		if !want[k] {
			drop = append(drop, k)
		}
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("list prefixes: %w", err)
	}
	for _, k := range drop {
		if err := m.Delete(k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return fmt.Errorf("remove prefix: %w", err)
		}
	}
	return nil
}

func lpm4(a netip.Addr, bits int) bpf.SkLookupLpmKey4 {
	b := a.As4()
	return bpf.SkLookupLpmKey4{Prefixlen: uint32(bits), Addr: binary.NativeEndian.Uint32(b[:])}
}

func lpm6(a netip.Addr, bits int) bpf.SkLookupLpmKey6 {
	b := a.As16()
	k := bpf.SkLookupLpmKey6{Prefixlen: uint32(bits)}
	for i := range k.Addr {
		k.Addr[i] = binary.NativeEndian.Uint32(b[4*i:])
	}
	return k
}

// prefixFromLPM4 decodes an IPv4 LPM trie key (the inverse of lpm4).
func prefixFromLPM4(k bpf.SkLookupLpmKey4) netip.Prefix {
	var b [4]byte
	binary.NativeEndian.PutUint32(b[:], k.Addr)
	return netip.PrefixFrom(netip.AddrFrom4(b), int(k.Prefixlen))
}

// prefixFromLPM6 decodes an IPv6 LPM trie key (the inverse of lpm6).
func prefixFromLPM6(k bpf.SkLookupLpmKey6) netip.Prefix {
	var b [16]byte
	for i, w := range k.Addr {
		binary.NativeEndian.PutUint32(b[4*i:], w)
	}
	return netip.PrefixFrom(netip.AddrFrom16(b), int(k.Prefixlen))
}

// SetSteerLoopback sets whether local clients' connections are steered.
func (r *Redirect) SetSteerLoopback(on bool) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.setFlag(flagSteerLoopback, on)
}

func (r *Redirect) setFlag(bit uint32, on bool) error {
	var c bpf.SkLookupConfig
	zero := uint32(0)
	if err := r.maps.Settings.Lookup(zero, &c); err != nil {
		return fmt.Errorf("read redirect settings: %w", err)
	}
	if on {
		c.Flags |= bit
	} else {
		c.Flags &^= bit
	}
	if err := r.maps.Settings.Update(zero, c, ebpf.UpdateAny); err != nil {
		return fmt.Errorf("write redirect settings: %w", err)
	}
	return nil
}

// Close releases this process's descriptors. It unpins nothing: the
// program stays attached and a restarted proxy takes over from the pins.
func (r *Redirect) Close() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return nil
	}
	r.closed = true
	var errs []error
	if r.prog != nil {
		errs = append(errs, r.prog.Close())
	}
	for _, m := range mapsByName(&r.maps) {
		if m != nil {
			errs = append(errs, m.Close())
		}
	}
	return errors.Join(errs...)
}

// Check reports whether the redirect is still in force: the link is pinned,
// attached to this Redirect's network namespace and runs this Redirect's
// program. It fails after `rl-tproxy redirect detach` or after another
// build upgraded the program; a readiness probe can call it.
func (r *Redirect) Check() error {
	l, err := link.LoadPinnedLink(filepath.Join(r.dir, pinLink), nil)
	if err != nil {
		return fmt.Errorf("redirect link pin in %s: %w", r.dir, err)
	}
	defer l.Close()
	info, err := l.Info()
	if err != nil {
		return fmt.Errorf("redirect link info: %w", err)
	}
	if ns := info.NetNs(); ns == nil || uint64(ns.NetnsInode) != r.ino&0xffffffff {
		return fmt.Errorf("redirect link in %s is not attached to network namespace %d", r.dir, r.ino)
	}
	pinfo, err := r.prog.Info()
	if err != nil {
		return fmt.Errorf("redirect program info: %w", err)
	}
	if !samePinned(pinfo, info.Program) {
		return fmt.Errorf("redirect link runs program %d, not this process's program", info.Program)
	}
	return nil
}
