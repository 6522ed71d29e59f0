package proxy

import (
	"context"
	"errors"
	"fmt"
	"net"
	"runtime"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"
)

// Listen opens a plain TCP listener on addr with Multipath TCP turned off:
// an sk_lookup sockmap only accepts plain TCP sockets, and Go enables MPTCP
// on listeners by default on some versions (GODEBUG=multipathtcp).
func Listen(ctx context.Context, addr string) (net.Listener, error) {
	var lc net.ListenConfig
	lc.SetMultipathTCP(false)
	ln, err := lc.Listen(ctx, "tcp", addr)
	if err != nil {
		return nil, err // a *net.OpError: "listen tcp ADDR: ..." already
	}
	return announceClose(ln), nil
}

// closeAnnouncer is a listener whose Close can be waited for: Serve on the
// event loops, whose loops accept on a duplicate of the socket, learns of
// the close from it at once (waitClosed) instead of looking every
// closedPoll.
type closeAnnouncer interface {
	net.Listener
	closed() <-chan struct{}
}

// tcpListener is a *net.TCPListener whose Close is announced: Listen and
// ListenGroup return it. Everything else (SyscallConn, File, AcceptTCP,
// SetDeadline) is the embedded listener's.
type tcpListener struct {
	*net.TCPListener
	once sync.Once
	done chan struct{}
}

// announceClose wraps a TCP listener; any other listener is returned as is.
func announceClose(ln net.Listener) net.Listener {
	tl, ok := ln.(*net.TCPListener)
	if !ok {
		return ln
	}
	return &tcpListener{TCPListener: tl, done: make(chan struct{})}
}

// Close closes the socket, then announces it: a waiter sees the listener
// closed.
func (l *tcpListener) Close() error {
	err := l.TCPListener.Close()
	l.once.Do(func() { close(l.done) })
	return err
}

func (l *tcpListener) closed() <-chan struct{} { return l.done }

// transientAcceptErr reports accept errors worth retrying after a pause.
func transientAcceptErr(err error) bool {
	return errors.Is(err, syscall.EMFILE) || errors.Is(err, syscall.ENFILE) ||
		errors.Is(err, syscall.ENOBUFS) || errors.Is(err, syscall.ENOMEM) ||
		errors.Is(err, syscall.ECONNABORTED)
}

// ListenGroup opens n plain TCP listeners (MPTCP off) bound to addr with
// SO_REUSEPORT: one reuseport group, across which the kernel spreads new
// connections by a hash of their addresses, so that each event loop (or
// accept goroutine) owns one socket. n <= 0 means runtime.GOMAXPROCS(0).
// When addr's port is 0 the first socket's bind picks the port (Linux
// never gives a port-0 bind a port that a SO_REUSEPORT socket on the same
// address holds, so the group is new) and the others bind to it. On error
// it closes what it opened.
//
// An address with a fixed port that another socket already holds is
// refused (EADDRINUSE) as a plain listener would be, even when that socket
// has SO_REUSEPORT: a second proxy on the same address fails to start
// instead of silently sharing the connections. (A SO_REUSEPORT socket of
// the same user bound later still joins the group: the kernel allows it.)
// A socket closed while others of its group stay open resets the
// connections waiting in its accept queue (unless the sysctl
// net.ipv4.tcp_migrate_req is 1): drain a socket's queue before closing it
// alone.
func ListenGroup(ctx context.Context, addr string, n int) ([]net.Listener, error) {
	if n <= 0 {
		n = runtime.GOMAXPROCS(0)
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, fmt.Errorf("listen: %w", err) // a *net.AddrError naming addr
	}
	if port != "0" {
		// Probe without SO_REUSEPORT: it fails on an address in use.
		probe, err := Listen(ctx, addr)
		if err != nil {
			return nil, err
		}
		probe.Close()
	}
	lc := net.ListenConfig{Control: setReusePort}
	lc.SetMultipathTCP(false)
	lns := make([]net.Listener, 0, n)
	bind := addr
	for i := range n {
		ln, err := lc.Listen(ctx, "tcp", bind)
		if err != nil {
			closeListeners(lns)
			return nil, fmt.Errorf("socket %d of a reuseport group of %d: %w", i+1, n, err)
		}
		if i == 0 {
			// The same host string (not ln.Addr(): "0.0.0.0" and ":" must
			// keep the family Go chose for addr) with the bound port.
			_, port, _ := net.SplitHostPort(ln.Addr().String())
			bind = net.JoinHostPort(host, port)
		}
		lns = append(lns, announceClose(ln))
	}
	return lns, nil
}

func setReusePort(_, _ string, c syscall.RawConn) error {
	var serr error
	if err := c.Control(func(fd uintptr) {
		serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_REUSEPORT, 1)
	}); err != nil {
		return err
	}
	if serr != nil {
		return fmt.Errorf("SO_REUSEPORT: %w", serr)
	}
	return nil
}

func closeListeners(lns []net.Listener) {
	for _, ln := range lns {
		ln.Close()
	}
}
