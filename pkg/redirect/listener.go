package redirect

import (
	"errors"
	"fmt"
	"net"
	"os"
	"syscall"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

// RegisterListener writes ln's socket into the sockmap: from the next SYN
// on, steered connections of its family land in ln's accept queue. This one
// update is the takeover when another proxy's listener held the slot. ln
// must be a plain TCP listener (MPTCP off). The kernel drops the entry when
// the listener's last descriptor closes, and steering falls back to the
// service.
func (r *Redirect) RegisterListener(ln net.Listener) error {
	sc, ok := ln.(syscall.Conn)
	if !ok {
		return fmt.Errorf("register listener %v: %T exposes no socket", ln.Addr(), ln)
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return fmt.Errorf("register listener %v: %w", ln.Addr(), err)
	}
	var opErr error
	err = rc.Control(func(fd uintptr) {
		opErr = r.registerFD(int(fd))
	})
	if err == nil {
		err = opErr
	}
	if err != nil {
		return fmt.Errorf("register listener %v: %w", ln.Addr(), err)
	}
	return nil
}

// listenerSlots returns the sockmap slots a listening socket serves.
func listenerSlots(fd int) ([]uint32, error) {
	proto, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_PROTOCOL)
	if err != nil {
		return nil, fmt.Errorf("socket protocol: %w", err)
	}
	if proto == unix.IPPROTO_MPTCP {
		return nil, errors.New("MPTCP socket cannot enter a sockmap: create the listener with net.ListenConfig.SetMultipathTCP(false)")
	}
	if proto != unix.IPPROTO_TCP {
		return nil, fmt.Errorf("socket protocol %d is not TCP", proto)
	}
	domain, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_DOMAIN)
	if err != nil {
		return nil, fmt.Errorf("socket domain: %w", err)
	}
	switch domain {
	case unix.AF_INET:
		return []uint32{SlotIPv4}, nil
	case unix.AF_INET6:
		v6only, err := unix.GetsockoptInt(fd, unix.IPPROTO_IPV6, unix.IPV6_V6ONLY)
		if err != nil {
			return nil, fmt.Errorf("socket IPV6_V6ONLY: %w", err)
		}
		if v6only == 1 {
			return []uint32{SlotIPv6}, nil
		}
		return []uint32{SlotIPv4, SlotIPv6}, nil
	}
	return nil, fmt.Errorf("socket family %d is not IPv4 or IPv6", domain)
}

func (r *Redirect) registerFD(fd int) error {
	slots, err := listenerSlots(fd)
	if err != nil {
		return err
	}
	for _, s := range slots {
		if err := r.maps.Sockets.Update(s, uint64(fd), ebpf.UpdateAny); err != nil {
			if errors.Is(err, unix.EOPNOTSUPP) {
				return fmt.Errorf("sockmap slot %d: %w (is the socket listening, plain TCP?)", s, err)
			}
			return fmt.Errorf("sockmap slot %d: %w", s, err)
		}
	}
	return nil
}

// listenerCookie returns the socket cookie of ln.
func listenerCookie(ln net.Listener) (uint64, error) {
	sc, ok := ln.(syscall.Conn)
	if !ok {
		return 0, fmt.Errorf("%T exposes no socket", ln)
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return 0, err
	}
	var cookie uint64
	var opErr error
	err = rc.Control(func(fd uintptr) {
		cookie, opErr = unix.GetsockoptUint64(int(fd), unix.SOL_SOCKET, unix.SO_COOKIE)
	})
	if err == nil {
		err = opErr
	}
	if err != nil {
		return 0, fmt.Errorf("socket cookie: %w", err)
	}
	return cookie, nil
}

// ListenerRegistered reports whether some sockmap slot still holds ln's
// socket. A proxy that was taken over (another proxy registered its own
// listener) sees false and can drain and exit.
func (r *Redirect) ListenerRegistered(ln net.Listener) (bool, error) {
	cookie, err := listenerCookie(ln)
	if err != nil {
		return false, fmt.Errorf("listener %v: %w", ln.Addr(), err)
	}
	for _, s := range []uint32{SlotIPv4, SlotIPv6} {
		var have uint64
		err := r.maps.Sockets.Lookup(s, &have)
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			continue
		}
		if err != nil {
			return false, fmt.Errorf("sockmap slot %d: %w", s, err)
		}
		if have == cookie {
			return true, nil
		}
	}
	return false, nil
}

// UnregisterListener empties the sockmap slots that still hold ln's socket
// (a slot another proxy took over is left alone), so new connections fall
// through to the service while ln drains.
func (r *Redirect) UnregisterListener(ln net.Listener) error {
	cookie, err := listenerCookie(ln)
	if err != nil {
		return fmt.Errorf("unregister listener %v: %w", ln.Addr(), err)
	}
	for _, s := range []uint32{SlotIPv4, SlotIPv6} {
		var have uint64
		if err := r.maps.Sockets.Lookup(s, &have); err != nil {
			continue // empty slot
		}
		if have != cookie {
			continue
		}
		if err := r.maps.Sockets.Delete(s); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return fmt.Errorf("unregister listener %v: slot %d: %w", ln.Addr(), s, err)
		}
	}
	return nil
}

// AcceptQueued accepts, without blocking, every connection already waiting
// in ln's accept queue. A proxy that was taken over (ListenerRegistered
// false) receives no new connections, so it can call AcceptQueued, serve
// what it returns, and close ln without resetting queued clients. (A
// handshake still in flight at the moment of the takeover can complete on
// the old listener a round trip later; drain again before closing.)
func AcceptQueued(ln net.Listener) ([]net.Conn, error) {
	sc, ok := ln.(syscall.Conn)
	if !ok {
		return nil, fmt.Errorf("accept queued on %v: %T exposes no socket", ln.Addr(), ln)
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return nil, fmt.Errorf("accept queued on %v: %w", ln.Addr(), err)
	}
	var (
		conns []net.Conn
		opErr error
	)
	// Control, not Read: RawConn.Read refuses listening sockets. The
	// socket is non-blocking, so accept4 answers EAGAIN on an empty queue.
	err = rc.Control(func(fd uintptr) {
		for range 1 << 16 { // bounded: at most one full backlog
			nfd, _, err := unix.Accept4(int(fd), unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC)
			switch {
			case errors.Is(err, unix.EAGAIN):
				return
			case errors.Is(err, unix.EINTR), errors.Is(err, unix.ECONNABORTED):
				continue
			case err != nil:
				opErr = err
				return
			}
			f := os.NewFile(uintptr(nfd), "accepted")
			c, err := net.FileConn(f)
			f.Close()
			if err != nil {
				opErr = err
				return
			}
			conns = append(conns, c)
		}
	})
	if err == nil {
		err = opErr
	}
	if err != nil {
		return conns, fmt.Errorf("accept queued on %v: %w", ln.Addr(), err)
	}
	return conns, nil
}
