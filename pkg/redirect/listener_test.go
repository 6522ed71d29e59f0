package redirect

import (
	"net"
	"testing"

	"github.com/rl-tproxy/rl-tproxy/internal/netnstest"
)

func TestAcceptQueued(t *testing.T) {
	ns := netnstest.New(t)
	ln := listenTCP(t, ns, "tcp4", "127.0.0.1:0")
	if conns, err := AcceptQueued(ln); err != nil || len(conns) != 0 {
		t.Fatalf("empty queue: %d conns, %v", len(conns), err)
	}
	const n = 3
	var clients []net.Conn
	if err := ns.Do(func() error {
		for range n {
			c, err := net.Dial("tcp4", ln.Addr().String())
			if err != nil {
				return err
			}
			clients = append(clients, c)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	defer func() {
		for _, c := range clients {
			c.Close()
		}
	}()
	conns, err := AcceptQueued(ln)
	if err != nil || len(conns) != n {
		t.Fatalf("AcceptQueued: %d conns, %v; want %d", len(conns), err, n)
	}
	for _, c := range conns {
		if c.LocalAddr().String() != ln.Addr().String() {
			t.Errorf("accepted conn local %v, want %v", c.LocalAddr(), ln.Addr())
		}
		c.Close()
	}
	if conns, err := AcceptQueued(ln); err != nil || len(conns) != 0 {
		t.Fatalf("drained queue: %d conns, %v", len(conns), err)
	}
}
