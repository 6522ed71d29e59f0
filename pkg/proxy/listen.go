package proxy

import (
	"context"
	"errors"
	"fmt"
	"net"
	"syscall"
)

// Listen opens a plain TCP listener on addr with Multipath TCP turned off:
// an sk_lookup sockmap only accepts plain TCP sockets, and Go enables MPTCP
// on listeners by default on some versions (GODEBUG=multipathtcp).
func Listen(ctx context.Context, addr string) (net.Listener, error) {
	var lc net.ListenConfig
	lc.SetMultipathTCP(false)
	ln, err := lc.Listen(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("listen %s: %w", addr, err)
	}
	return ln, nil
}

// transientAcceptErr reports accept errors worth retrying after a pause.
func transientAcceptErr(err error) bool {
	return errors.Is(err, syscall.EMFILE) || errors.Is(err, syscall.ENFILE) ||
		errors.Is(err, syscall.ENOBUFS) || errors.Is(err, syscall.ENOMEM) ||
		errors.Is(err, syscall.ECONNABORTED)
}
