package testkit

import (
	"net"
	"strconv"
	"testing"
)

// TestFreePortBelowEphemeral: the ports handed out are below the kernel's
// ephemeral range (where no outgoing connection can take them) and free
// for every protocol asked, which a listener then proves.
func TestFreePortBelowEphemeral(t *testing.T) {
	for _, tc := range []struct {
		name     string
		tcp, udp bool
	}{{"tcp", true, false}, {"udp", false, true}, {"both", true, true}} {
		t.Run(tc.name, func(t *testing.T) {
			port, err := FreePort(tc.tcp, tc.udp)
			if err != nil {
				t.Fatal(err)
			}
			if port < lowestPort || port >= ephemeralStart() {
				t.Fatalf("port %d outside [%d, %d)", port, lowestPort, ephemeralStart())
			}
			addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
			if tc.tcp {
				ln, err := net.Listen("tcp4", addr)
				if err != nil {
					t.Fatalf("port %d not free for TCP: %v", port, err)
				}
				ln.Close()
			}
			if tc.udp {
				pc, err := net.ListenPacket("udp4", addr)
				if err != nil {
					t.Fatalf("port %d not free for UDP: %v", port, err)
				}
				pc.Close()
			}
		})
	}
}

// TestFreePortSkipsTaken: a port in use is never handed out.
func TestFreePortSkipsTaken(t *testing.T) {
	ln, err := net.Listen("tcp4", FreeAddr(t))
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	taken := ln.Addr().(*net.TCPAddr).Port
	for range 200 {
		if err := bindable(taken, true, false); err == nil {
			t.Fatalf("port %d bound twice", taken)
		}
		if p, err := FreePort(true, false); err != nil || p == taken {
			t.Fatalf("FreePort = %d, %v; %d is taken", p, err, taken)
		}
	}
}
