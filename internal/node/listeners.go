package node

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"sort"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/rl-tproxy/rl-tproxy/pkg/admission"
	"github.com/rl-tproxy/rl-tproxy/pkg/exchange"
	"github.com/rl-tproxy/rl-tproxy/pkg/proxy"
	"github.com/rl-tproxy/rl-tproxy/pkg/redirect"
)

// acceptQueueLen is the number of connections waiting in a listening
// socket's accept queue (TCP_INFO's tcpi_unacked on a LISTEN socket).
func acceptQueueLen(ln net.Listener) (int, error) {
	sc, ok := ln.(syscall.Conn)
	if !ok {
		return 0, fmt.Errorf("%T exposes no socket", ln)
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return 0, err
	}
	var n int
	var ierr error
	if err := rc.Control(func(fd uintptr) {
		var info *unix.TCPInfo
		info, ierr = unix.GetsockoptTCPInfo(int(fd), unix.IPPROTO_TCP, unix.TCP_INFO)
		if ierr == nil {
			n = int(info.Unacked)
		}
	}); err != nil {
		return 0, err
	}
	return n, ierr
}

// drainAcceptQueues waits (bounded by ctx and 2s) until every listener's
// accept queue was empty at two checks 50ms apart: handshakes that were in
// flight when the sockmap slot changed complete within that round trip.
func drainAcceptQueues(ctx context.Context, lns []net.Listener) {
	deadline := time.Now().Add(2 * time.Second)
	empty := 0
	for empty < 2 && time.Now().Before(deadline) && ctx.Err() == nil {
		total := 0
		for _, ln := range lns {
			if n, err := acceptQueueLen(ln); err == nil {
				total += n
			}
		}
		if total == 0 {
			empty++
		} else {
			empty = 0
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// takeoverPoll is how often a steered proxy checks that its listeners are
// still in the sockmap.
const takeoverPoll = 500 * time.Millisecond

// watchTakeover closes n.takenOver once none of this proxy's steered
// listeners is in the sockmap any more: a newer proxy registered its own
// (the takeover of a rolling update or restart), so this one drains and
// exits.
func (n *Node) watchTakeover(ctx context.Context) {
	t := time.NewTicker(takeoverPoll)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		groups := n.steeredGroups()
		still := false
		for _, g := range groups {
			ok, err := n.redirect.ListenerRegistered(g[0])
			if err != nil || ok {
				still = true // on a read error, keep serving
				break
			}
		}
		if !still && len(groups) > 0 {
			n.log.Info("steering taken over by another proxy: draining and exiting")
			close(n.takenOver)
			return
		}
	}
}

// steeredPorts lists the policy's steered ports (nil when none).
func steeredPorts(p *admission.Policy) []uint16 {
	var ports []uint16
	for _, s := range p.Services {
		if s.Port != 0 && !slices.Contains(ports, s.Port) {
			ports = append(ports, s.Port)
		}
	}
	sort.Slice(ports, func(i, j int) bool { return ports[i] < ports[j] })
	return ports
}

func redirectConfig(p *admission.Policy) redirect.Config {
	cfg := redirect.Config{Ports: steeredPorts(p)}
	any := false
	for _, s := range p.Services {
		if s.Port == 0 {
			continue
		}
		if len(s.Prefixes) == 0 {
			any = true
		}
		cfg.Prefixes = append(cfg.Prefixes, s.Prefixes...)
		cfg.SteerLoopback = cfg.SteerLoopback || s.SteerLoopback
	}
	if any {
		cfg.Prefixes = nil
	}
	return cfg
}

func (n *Node) attachRedirect(p *admission.Policy) error {
	if err := redirect.EnsureBPFFS("/sys/fs/bpf"); err != nil {
		return fmt.Errorf("steered services need bpffs: %w", err)
	}
	cfg := redirectConfig(p)
	cfg.Upgrade = n.opts.UpgradeRedirect
	r, err := redirect.Attach(cfg)
	if errors.Is(err, redirect.ErrIncompatible) {
		return fmt.Errorf("attach sk_lookup redirect: %w (rl-tproxy run --upgrade-redirect replaces it in place)", err)
	}
	if err != nil {
		return fmt.Errorf("attach sk_lookup redirect: %w", err)
	}
	if r.Upgraded() {
		n.log.Warn("replaced the pinned sk_lookup program of another build in place", "tag", r.ProgramTag())
	}
	n.redirect = r
	n.m.Registry.MustRegister(r.Collector())
	n.ready.Set("redirect", func() error {
		groups := n.steeredGroups()
		for _, g := range groups {
			ok, err := r.ListenerRegistered(g[0])
			if err != nil {
				return err
			}
			if !ok {
				return fmt.Errorf("listener %s is not in the sockmap (taken over?)", g[0].Addr())
			}
		}
		if len(groups) == 0 {
			return errors.New("no steered listener")
		}
		return nil
	})
	return nil
}

// serveSteered opens the steered listener groups (IPv4 and, when the host
// has it, IPv6 loopback; each a SO_REUSEPORT group of one socket per event
// loop or CPU), registers the first socket of each in the sockmap (the
// kernel's reuseport selection then spreads steered connections over the
// group) and serves every socket.
func (n *Node) serveSteered(ctx context.Context) error {
	for _, addr := range []string{"127.0.0.1:0", "[::1]:0"} {
		lns, err := proxy.ListenGroup(ctx, addr, n.proxy.ListenGroupSize())
		if err != nil {
			if strings.HasPrefix(addr, "[") {
				continue // no IPv6 loopback
			}
			return fmt.Errorf("steered listener: %w", err)
		}
		if err := n.redirect.RegisterListener(lns[0]); err != nil {
			closeListeners(lns)
			if strings.HasPrefix(addr, "[") {
				n.log.Warn("IPv6 steered listener not registered", "error", err.Error())
				continue
			}
			return fmt.Errorf("register steered listener: %w", err)
		}
		n.mu.Lock()
		n.steered = append(n.steered, lns)
		n.publishListeners()
		n.mu.Unlock()
		where := lns[0].Addr().String()
		n.log.Info("steered listener registered", "addr", where, "sockets", len(lns), "ports", fmt.Sprint(steeredPorts(n.pol)))
		go func() {
			err := n.proxy.ServeSteeredGroup(lns, nil)
			n.serveEnded("steered "+where, err, nil)
		}()
	}
	return nil
}

func closeListeners(lns []net.Listener) {
	for _, ln := range lns {
		ln.Close()
	}
}

func (n *Node) syncListeners(ctx context.Context, p *admission.Policy) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	opened, err := n.openListeners(ctx, p)
	if err != nil {
		return err
	}
	n.commitListeners(p, opened)
	return nil
}

// wantListeners maps each listener-mode address of p to its service.
func wantListeners(p *admission.Policy) map[string]string {
	want := map[string]string{}
	for _, s := range p.Services {
		for _, a := range s.Listen {
			want[a.String()] = s.Name
		}
	}
	return want
}

// movedListeners rejects a policy that moves an open listen address to
// another service (a swap, or a renamed service): the address's Serve
// loop forwards to the service it was started for, while admission
// would pick the new one by local address, so only half of such a
// policy would apply. n.mu is held.
func (n *Node) movedListeners(p *admission.Policy) error {
	want := wantListeners(p)
	addrs := make([]string, 0, len(n.listeners))
	for a := range n.listeners {
		addrs = append(addrs, a)
	}
	sort.Strings(addrs)
	for _, addr := range addrs {
		if svc, ok := want[addr]; ok && svc != n.listeners[addr].svc {
			return fmt.Errorf("listen address %s moves from service %s to service %s: restart to apply", addr, n.listeners[addr].svc, svc)
		}
	}
	return nil
}

// openListeners opens the listener-mode addresses of p that are not open
// yet; on error it closes what it opened. An address already open stays
// with its service (movedListeners rejected a policy that moves it).
func (n *Node) openListeners(ctx context.Context, p *admission.Policy) (map[string]*listener, error) {
	want := wantListeners(p)
	addrs := make([]string, 0, len(want))
	for a := range want {
		addrs = append(addrs, a)
	}
	sort.Strings(addrs)
	opened := map[string]*listener{}
	for _, addr := range addrs {
		if _, ok := n.listeners[addr]; ok {
			continue
		}
		lns, err := proxy.ListenGroup(ctx, addr, n.proxy.ListenGroupSize())
		if err != nil {
			closeAll(opened)
			return nil, fmt.Errorf("service %s: %w", want[addr], err) // err names the address
		}
		opened[addr] = &listener{lns: lns, svc: want[addr]}
	}
	return opened, nil
}

// commitListeners serves the newly opened listeners and closes those p no
// longer has (their in-flight requests finish). An address that stays
// keeps its socket and Serve loop: it serves the same service name (a
// policy moving it to another service was rejected by movedListeners).
func (n *Node) commitListeners(p *admission.Policy, opened map[string]*listener) {
	want := wantListeners(p)
	svcs := map[string]*exchange.Service{}
	for _, s := range n.proxy.Config().Services {
		svcs[s.Name] = s
	}
	for addr, l := range n.listeners {
		if _, ok := want[addr]; !ok {
			l.closed = true
			closeListeners(l.lns)
			// On the event-loop path the loops accept on duplicates of
			// the sockets, which Serve closes as it returns: wait for
			// that (bounded) so that the address refuses connections
			// once the reload is done.
			select {
			case <-l.served:
			case <-time.After(5 * time.Second):
				n.log.Warn("listener's serve loop still running after close", "addr", addr)
			}
			delete(n.listeners, addr)
			n.publishListeners()
			n.log.Info("listener closed", "addr", addr, "service", l.svc)
		}
	}
	for addr, l := range opened {
		l.served = make(chan struct{})
		n.listeners[addr] = l
		n.publishListeners()
		svc := svcs[l.svc]
		n.log.Info("listening", "service", l.svc, "addr", l.lns[0].Addr().String(), "sockets", len(l.lns), "upstream", svc.Upstream)
		go func() {
			err := n.proxy.ServeGroup(l.lns, svc)
			close(l.served)
			n.serveEnded("listener "+addr, err, l)
		}()
	}
}

// serveEnded turns an unexpected end of a Serve loop into a runtime
// failure.
func (n *Node) serveEnded(what string, err error, l *listener) {
	n.mu.Lock()
	expected := n.closing || (l != nil && l.closed)
	n.mu.Unlock()
	if expected || errors.Is(err, proxy.ErrClosed) || errors.Is(err, net.ErrClosed) {
		return
	}
	if err == nil {
		err = errors.New("stopped")
	}
	select {
	case n.failed <- fmt.Errorf("%s: %w", what, err):
	default:
	}
}

// listenersUp is the "listeners" readiness check; it reads the published
// view and never waits for n.mu.
func (n *Node) listenersUp() error {
	if n.nListeners.Load() == 0 {
		return errors.New("no listener")
	}
	return nil
}

// publishListeners refreshes the lock-free view of the listeners after a
// change; n.mu is held.
func (n *Node) publishListeners() {
	steered := slices.Clone(n.steered)
	n.steeredNow.Store(&steered)
	n.nListeners.Store(int64(len(n.listeners) + len(n.steered)))
}

// steeredGroups is the published list of steered listener groups.
func (n *Node) steeredGroups() [][]net.Listener {
	if p := n.steeredNow.Load(); p != nil {
		return *p
	}
	return nil
}
