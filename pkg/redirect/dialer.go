package redirect

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"syscall"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/rl-tproxy/rl-tproxy/bpf"
)

// DialContext connects to addr ("tcp", "tcp4" or "tcp6"; addr is
// host:port) so that the sk_lookup program does not steer the connection
// back to the proxy: the socket is bound to the route's source address and
// an ephemeral port, that address goes into the bypass map, then it
// connects. The entry is removed once the connect attempt has finished
// (sk_lookup only runs for the SYN). Its signature fits proxy.Config.Dial.
func (r *Redirect) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	switch network {
	case "tcp", "tcp4", "tcp6":
	default:
		return nil, fmt.Errorf("bypass dial %s %s: network must be tcp, tcp4 or tcp6", network, addr)
	}
	dst, err := resolve(ctx, network, addr)
	if err != nil {
		return nil, fmt.Errorf("bypass dial %s: %w", addr, err)
	}
	src, err := sourceAddr(dst)
	if err != nil {
		return nil, fmt.Errorf("bypass dial %s: %w", addr, err)
	}
	var (
		key      bpf.SkLookupBypassKey
		inserted bool
	)
	d := net.Dialer{
		Control: func(_, _ string, c syscall.RawConn) error {
			var opErr error
			err := c.Control(func(fd uintptr) {
				key, opErr = r.bindAndBypass(int(fd), src)
				inserted = opErr == nil
			})
			if err != nil {
				return err
			}
			return opErr
		},
	}
	d.SetMultipathTCP(false)
	conn, err := d.DialContext(ctx, network, dst.String())
	if inserted {
		if derr := r.maps.Bypass.Delete(key); derr != nil && !errors.Is(derr, ebpf.ErrKeyNotExist) && err == nil {
			conn.Close()
			return nil, fmt.Errorf("bypass dial %s: remove bypass entry: %w", addr, derr)
		}
	}
	if err != nil {
		return nil, err
	}
	return conn, nil
}

// DialPrep readies fd, a new non-blocking TCP socket about to connect to
// dst, the way DialContext does before its connect: bound to the route's
// source address and an ephemeral port, that address in the bypass map.
// The returned function removes the entry; the caller runs it once the
// connect attempt finished (sk_lookup only runs for the SYN). Its
// signature fits proxy.Config.DialPrep, so the event loops connect to an
// upstream without a goroutine.
func (r *Redirect) DialPrep(fd int, dst netip.AddrPort) (func(), error) {
	dst = netip.AddrPortFrom(dst.Addr().Unmap(), dst.Port())
	src, err := sourceAddr(dst)
	if err != nil {
		return nil, fmt.Errorf("bypass dial %v: %w", dst, err)
	}
	key, err := r.bindAndBypass(fd, src)
	if err != nil {
		return nil, fmt.Errorf("bypass dial %v: %w", dst, err)
	}
	return func() {
		// Best effort: an entry left behind only exempts that local
		// address and port from steering until it is reused.
		_ = r.maps.Bypass.Delete(key)
	}, nil
}

// Dialer returns DialContext as a value, for configs that take a dial func.
func (r *Redirect) Dialer() func(ctx context.Context, network, addr string) (net.Conn, error) {
	return r.DialContext
}

// bindAndBypass binds fd to src with an ephemeral port and records the
// resulting address in the bypass map.
func (r *Redirect) bindAndBypass(fd int, src netip.Addr) (bpf.SkLookupBypassKey, error) {
	var sa unix.Sockaddr
	if src.Is4() {
		sa = &unix.SockaddrInet4{Addr: src.As4()}
	} else {
		sa = &unix.SockaddrInet6{Addr: src.As16()}
	}
	if err := unix.Bind(fd, sa); err != nil {
		return bpf.SkLookupBypassKey{}, fmt.Errorf("bind %v: %w", src, err)
	}
	got, err := unix.Getsockname(fd)
	if err != nil {
		return bpf.SkLookupBypassKey{}, fmt.Errorf("getsockname: %w", err)
	}
	var port int
	switch a := got.(type) {
	case *unix.SockaddrInet4:
		port = a.Port
	case *unix.SockaddrInet6:
		port = a.Port
	default:
		return bpf.SkLookupBypassKey{}, fmt.Errorf("unexpected local address %T", got)
	}
	key := BypassKey(netip.AddrPortFrom(src, uint16(port)))
	if err := r.maps.Bypass.Update(key, uint8(1), ebpf.UpdateAny); err != nil {
		return bpf.SkLookupBypassKey{}, fmt.Errorf("insert bypass entry: %w", err)
	}
	return key, nil
}

// BypassKey is the bypass map key of a connecting socket's local address
// (what the program sees as remote ip and port).
func BypassKey(ap netip.AddrPort) bpf.SkLookupBypassKey {
	a := ap.Addr().Unmap()
	k := bpf.SkLookupBypassKey{Port: ap.Port()}
	if a.Is4() {
		k.Family = unix.AF_INET
		b := a.As4()
		k.Addr[0] = binary.NativeEndian.Uint32(b[:])
		return k
	}
	k.Family = unix.AF_INET6
	b := a.As16()
	for i := range k.Addr {
		k.Addr[i] = binary.NativeEndian.Uint32(b[4*i:])
	}
	return k
}

// resolve turns host:port into one address of the requested family.
func resolve(ctx context.Context, network, addr string) (netip.AddrPort, error) {
	if ap, err := netip.ParseAddrPort(addr); err == nil {
		ap = netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
		if (network == "tcp4" && !ap.Addr().Is4()) || (network == "tcp6" && !ap.Addr().Is6()) {
			return netip.AddrPort{}, fmt.Errorf("address family does not match %s", network)
		}
		return ap, nil
	}
	host, portStr, err := net.SplitHostPort(addr)
	if err != nil {
		return netip.AddrPort{}, err
	}
	port, err := strconv.ParseUint(portStr, 10, 16)
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("port %q: %w", portStr, err)
	}
	ipNet := map[string]string{"tcp": "ip", "tcp4": "ip4", "tcp6": "ip6"}[network]
	ips, err := net.DefaultResolver.LookupNetIP(ctx, ipNet, host)
	if err != nil {
		return netip.AddrPort{}, err
	}
	if len(ips) == 0 {
		return netip.AddrPort{}, fmt.Errorf("no address for %s", host)
	}
	return netip.AddrPortFrom(ips[0].Unmap(), uint16(port)), nil
}

// sourceAddr asks the kernel which source address a connection to dst
// uses (a connected UDP socket sends nothing).
func sourceAddr(dst netip.AddrPort) (netip.Addr, error) {
	c, err := net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(dst))
	if err != nil {
		return netip.Addr{}, fmt.Errorf("route to %v: %w", dst, err)
	}
	defer c.Close()
	return c.LocalAddr().(*net.UDPAddr).AddrPort().Addr().Unmap(), nil
}
