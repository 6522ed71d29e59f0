package testkit

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
	"testing"
)

// A test that must write a concrete port into a policy or a flag (a child
// process binds it, not the test) can only pick one that is free now and
// hope it still is when the child binds. A port from net.Listen(":0") is
// an ephemeral one: every outgoing connection of every test running at
// the same time draws from the same range, so under `go test -p 4` one of
// them takes the port in between ("bind: address already in use"). The
// ports below the ephemeral range are never handed out by the kernel, so
// only another explicit bind can take them, and picking at random among
// thousands of them makes that unlikely.

// lowestPort is the first port FreePort picks from: above the registered
// services a test machine may run.
const lowestPort = 10000

// FreeAddr returns 127.0.0.1:port with a TCP port that is free and below
// the kernel's ephemeral range (see above). It fails t when none is found.
func FreeAddr(t testing.TB) string {
	t.Helper()
	port, err := FreePort(true, false)
	if err != nil {
		t.Fatalf("free loopback port: %v", err)
	}
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
}

// FreePort returns a loopback port below the ephemeral range that is free
// for TCP (tcp), for UDP (udp) or both, trying up to 100 random ones.
func FreePort(tcp, udp bool) (int, error) {
	lo, hi := lowestPort, ephemeralStart()
	if hi-lo < 1000 {
		return 0, fmt.Errorf("ephemeral ports start at %d: too few ports below for a random pick", hi)
	}
	var lastErr error
	for range 100 {
		port := lo + rand.IntN(hi-lo)
		if err := bindable(port, tcp, udp); err != nil {
			lastErr = err
			continue
		}
		return port, nil
	}
	return 0, fmt.Errorf("no free port in [%d, %d) after 100 tries: %w", lo, hi, lastErr)
}

// bindable binds port on 127.0.0.1 for the protocols asked and releases it.
func bindable(port int, tcp, udp bool) error {
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	var closers []interface{ Close() error }
	defer func() {
		for _, c := range closers {
			_ = c.Close()
		}
	}()
	if tcp {
		ln, err := net.Listen("tcp4", addr)
		if err != nil {
			return err
		}
		closers = append(closers, ln)
	}
	if udp {
		pc, err := net.ListenPacket("udp4", addr)
		if err != nil {
			return err
		}
		closers = append(closers, pc)
	}
	return nil
}

// ephemeralStart is the first port of net.ipv4.ip_local_port_range
// (32768, the kernel's default, when it cannot be read).
func ephemeralStart() int {
	const def = 32768
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return def
	}
	f := strings.Fields(string(b))
	if len(f) != 2 {
		return def
	}
	n, err := strconv.Atoi(f[0])
	if err != nil || n <= 0 {
		return def
	}
	return n
}
