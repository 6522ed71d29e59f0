package redirect

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"

	"github.com/rl-tproxy/rl-tproxy/bpf"
)

// State is the pinned redirect of one network namespace, as Status reads it.
type State struct {
	Pinned        bool   // a link is pinned for this namespace
	Reason        string // why Pinned is false
	Dir           string // PinRoot/<netns inode>
	NetnsInode    uint64
	LinkID        uint32
	ProgramID     uint32
	ProgramTag    string
	MatchesBinary bool // the attached program is the one embedded in this binary
	Ports         []uint16
	Prefixes      []netip.Prefix // empty: every destination
	SteerLoopback bool
	Sockets       []Socket // one per sockmap slot
	BypassEntries int      // upstream connects in flight
	Counters      Counters
}

// Socket is one sockmap slot.
type Socket struct {
	Slot    uint32
	Family  string // "ipv4" or "ipv6"
	Present bool
	Cookie  uint64 // socket cookie when present
}

// Status reads the pinned state of the calling thread's network namespace
// under pinRoot ("" = DefaultPinRoot) without changing anything. Nothing
// pinned is not an error: State.Pinned is false and Reason says why.
func Status(pinRoot string) (*State, error) {
	if pinRoot == "" {
		pinRoot = DefaultPinRoot
	}
	dir, ino, err := stateDir(pinRoot)
	if err != nil {
		return nil, err
	}
	st := &State{Dir: dir, NetnsInode: ino}
	if err := checkBPFFS(pinRoot); err != nil {
		st.Reason = err.Error()
		return st, nil
	}
	linkPin := filepath.Join(dir, pinLink)
	if !exists(linkPin) {
		st.Reason = "nothing pinned at " + linkPin
		return st, nil
	}
	l, err := link.LoadPinnedLink(linkPin, nil)
	if err != nil {
		return nil, fmt.Errorf("load pinned link %s: %w", linkPin, err)
	}
	defer l.Close()
	st.Pinned = true
	info, err := l.Info()
	if err != nil {
		return nil, fmt.Errorf("pinned link info: %w", err)
	}
	if ns := info.NetNs(); ns == nil || uint64(ns.NetnsInode) != ino&0xffffffff {
		st.Pinned = false
		st.Reason = fmt.Sprintf("stale pins in %s: the pinned link is no longer attached to this network namespace (rl-tproxy redirect detach removes them)", dir)
		return st, nil
	}
	st.LinkID = uint32(info.ID)
	st.ProgramID = uint32(info.Program)
	st.readProgram(dir, info.Program)
	if err := st.readMaps(dir); err != nil {
		return st, fmt.Errorf("read pinned redirect state in %s: %w", dir, err)
	}
	return st, nil
}

// readProgram sets the tag of the pinned program and whether it is this
// binary's, if the link runs it. (Opening the pin needs no CAP_SYS_ADMIN,
// unlike getting a program by id.)
func (st *State) readProgram(dir string, attached ebpf.ProgramID) {
	prog, err := ebpf.LoadPinnedProgram(filepath.Join(dir, pinProgram), nil)
	if err != nil {
		return
	}
	defer prog.Close()
	if pinfo, err := prog.Info(); err == nil && samePinned(pinfo, attached) {
		st.ProgramTag = pinfo.Tag
		if spec, err := bpf.LoadSkLookup(); err == nil {
			st.MatchesBinary = spec.Programs[bpf.SkLookupProgSteer].Compatible(pinfo) == nil
		}
	}
}

// readMaps fills st from the pinned maps, opened read-only. It reads every
// map it can and returns the errors of the others, joined.
func (st *State) readMaps(dir string) error {
	readers := []struct {
		name string
		read func(m *ebpf.Map) error
	}{
		{bpf.SkLookupMapSteerPorts, func(m *ebpf.Map) (err error) { st.Ports, err = listPorts(m); return err }},
		{bpf.SkLookupMapDstPrefixes4, func(m *ebpf.Map) error {
			return eachKey(m, func(k *bpf.SkLookupLpmKey4) { st.Prefixes = append(st.Prefixes, prefixFromLPM4(*k)) })
		}},
		{bpf.SkLookupMapDstPrefixes6, func(m *ebpf.Map) error {
			return eachKey(m, func(k *bpf.SkLookupLpmKey6) { st.Prefixes = append(st.Prefixes, prefixFromLPM6(*k)) })
		}},
		{bpf.SkLookupMapSettings, func(m *ebpf.Map) error {
			var c bpf.SkLookupConfig
			if err := m.Lookup(uint32(0), &c); err != nil {
				return err
			}
			st.SteerLoopback = c.Flags&flagSteerLoopback != 0
			return nil
		}},
		{bpf.SkLookupMapSockets, st.readSockets},
		{bpf.SkLookupMapBypass, func(m *ebpf.Map) error {
			return eachKey(m, func(*bpf.SkLookupBypassKey) { st.BypassEntries++ })
		}},
		{bpf.SkLookupMapCounters, func(m *ebpf.Map) (err error) { st.Counters, err = readCounters(m); return err }},
	}
	var errs []error
	for _, r := range readers {
		m, err := ebpf.LoadPinnedMap(filepath.Join(dir, pinMapPfx+r.name), &ebpf.LoadPinOptions{ReadOnly: true})
		if err != nil {
			errs = append(errs, fmt.Errorf("load pinned map %s: %w", r.name, err))
			continue
		}
		errs = append(errs, r.read(m))
		m.Close()
	}
	slices.SortFunc(st.Prefixes, func(a, b netip.Prefix) int {
		if c := a.Addr().Compare(b.Addr()); c != 0 {
			return c
		}
		return a.Bits() - b.Bits()
	})
	return errors.Join(errs...)
}

// readSockets reports which sockmap slots hold a listener.
func (st *State) readSockets(m *ebpf.Map) error {
	var errs []error
	for _, s := range []uint32{SlotIPv4, SlotIPv6} {
		sock := Socket{Slot: s, Family: map[uint32]string{SlotIPv4: "ipv4", SlotIPv6: "ipv6"}[s]}
		var cookie uint64
		if err := m.Lookup(s, &cookie); err == nil {
			sock.Present, sock.Cookie = true, cookie
		} else if !errors.Is(err, ebpf.ErrKeyNotExist) {
			errs = append(errs, fmt.Errorf("sockmap slot %d: %w", s, err))
		}
		st.Sockets = append(st.Sockets, sock)
	}
	return errors.Join(errs...)
}

// eachKey calls fn with every key of m, whose values are one byte.
func eachKey[K any](m *ebpf.Map, fn func(*K)) error {
	var k K
	var v uint8
	it := m.Iterate()
	for it.Next(&k, &v) {
		fn(&k)
	}
	return it.Err()
}

// Detach removes the redirect of the calling thread's network namespace:
// it detaches the pinned link from the namespace (even if a running proxy
// still holds descriptors) and removes every pin and the directory. It
// returns ErrNotAttached when nothing is pinned.
func Detach(pinRoot string) error {
	if pinRoot == "" {
		pinRoot = DefaultPinRoot
	}
	if err := checkBPFFS(pinRoot); err != nil {
		return err
	}
	dir, _, err := stateDir(pinRoot)
	if err != nil {
		return err
	}
	if !exists(dir) {
		return fmt.Errorf("%w: %s does not exist", ErrNotAttached, dir)
	}
	unlock, err := lockDir(dir)
	if err != nil {
		return err
	}
	defer unlock()
	linkPin := filepath.Join(dir, pinLink)
	attached := exists(linkPin)
	if attached {
		l, err := link.LoadPinnedLink(linkPin, nil)
		if err != nil {
			return fmt.Errorf("load pinned link %s: %w", linkPin, err)
		}
		err = l.Detach()
		l.Close()
		if err != nil {
			return fmt.Errorf("detach %s: %w", linkPin, err)
		}
	}
	if err := removePins(dir); err != nil {
		return fmt.Errorf("remove pins in %s: %w", dir, err)
	}
	if err := os.Remove(dir); err != nil {
		return fmt.Errorf("remove %s: %w", dir, err)
	}
	if !attached {
		return fmt.Errorf("%w: no link was pinned in %s (removed leftover pins)", ErrNotAttached, dir)
	}
	return nil
}
