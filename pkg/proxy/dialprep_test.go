package proxy

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync/atomic"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/rl-tproxy/rl-tproxy/pkg/exchange"
)

// TestDialPrep: with Config.DialPrep the loops connect to an upstream
// named by IP address themselves: DialPrep gets the socket before its
// connect (here it binds it to 127.0.0.3, which the upstream then sees as
// the peer) and its function runs once per connect attempt; Dial (kept
// for host names) is not called. A DialPrep error fails the request with
// 502 and nothing runs after it.
func TestDialPrep(t *testing.T) {
	var peers atomic.Value
	up := newRawUpstream(t, func(_ int, c net.Conn) {
		peers.Store(c.RemoteAddr().String())
		br := bufio.NewReader(c)
		for {
			if _, err := readRequestHead(br); err != nil {
				return
			}
			fmt.Fprint(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
		}
	})
	for _, tc := range []struct {
		name    string
		prepErr error
		status  int
	}{
		{"bound", nil, 200},
		{"prep fails", errors.New("no route for the test"), 502},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var preps, afters, dials atomic.Int32
			prep := func(fd int, dst netip.AddrPort) (func(), error) {
				preps.Add(1)
				if dst.String() != up.addr() {
					t.Errorf("DialPrep for %v, want %s", dst, up.addr())
				}
				if tc.prepErr != nil {
					return nil, tc.prepErr
				}
				if err := unix.Bind(fd, &unix.SockaddrInet4{Addr: [4]byte{127, 0, 0, 3}}); err != nil {
					return nil, err
				}
				return func() { afters.Add(1) }, nil
			}
			_, addr := startProxy(t, nil, &exchange.Service{Upstream: up.addr()}, func(c *Config) {
				c.EventLoops = 1
				c.DialPrep = prep
				c.Dial = func(context.Context, string, string) (net.Conn, error) {
					dials.Add(1)
					return nil, errors.New("Dial called for an IP upstream")
				}
			})
			cl := dialClient(t, addr)
			cl.send("GET / HTTP/1.1\r\nHost: x\r\n\r\n")
			r, _ := cl.resp("GET")
			if r.StatusCode != tc.status {
				t.Fatalf("status %d, want %d", r.StatusCode, tc.status)
			}
			if preps.Load() != 1 || dials.Load() != 0 {
				t.Fatalf("DialPrep %d times, Dial %d times", preps.Load(), dials.Load())
			}
			if tc.prepErr != nil {
				if afters.Load() != 0 {
					t.Fatal("DialPrep's function ran after DialPrep failed")
				}
				return
			}
			if afters.Load() != 1 {
				t.Fatalf("DialPrep's function ran %d times, want once", afters.Load())
			}
			if p, _ := peers.Load().(string); p == "" || netip.MustParseAddrPort(p).Addr() != netip.MustParseAddr("127.0.0.3") {
				t.Fatalf("upstream saw peer %q, want 127.0.0.3", p)
			}
		})
	}
}
