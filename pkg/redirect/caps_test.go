package redirect

import (
	"context"
	"fmt"
	"net"
	"os"
	"strings"
	"testing"

	"github.com/rl-tproxy/rl-tproxy/internal/netnstest"
	"github.com/rl-tproxy/rl-tproxy/internal/testkit"
)

// capsProbe is what a proxy does at start, restart and takeover, run by a
// helper process that holds only CAP_BPF and CAP_NET_ADMIN (what the
// systemd unit and the DaemonSet grant).
func capsProbe(root, upstream string) error {
	cfg := Config{PinRoot: root, Ports: []uint16{80}}
	r, err := Attach(cfg)
	if err != nil {
		return fmt.Errorf("first attach: %w", err)
	}
	r.Close()
	r, err = Attach(cfg) // restart: reuse the pins
	if err != nil {
		return fmt.Errorf("reattach: %w", err)
	}
	defer r.Close()
	var lc net.ListenConfig
	lc.SetMultipathTCP(false)
	ln, err := lc.Listen(context.Background(), "tcp4", "127.0.0.1:0")
	if err != nil {
		return err
	}
	defer ln.Close()
	if err := r.RegisterListener(ln); err != nil {
		return err
	}
	if on, err := r.ListenerRegistered(ln); err != nil || !on {
		return fmt.Errorf("listener registered: %v %v", on, err)
	}
	c, err := r.DialContext(context.Background(), "tcp", upstream)
	if err != nil {
		return fmt.Errorf("bypass dial: %w", err)
	}
	c.Close()
	if err := r.SetPorts([]uint16{80, 81}); err != nil {
		return err
	}
	if _, err := r.Counters(); err != nil {
		return err
	}
	st, err := Status(root)
	if err != nil {
		return fmt.Errorf("status: %w", err)
	}
	if !st.Pinned || !st.MatchesBinary || !st.Sockets[0].Present {
		return fmt.Errorf("status: %+v", st)
	}
	return nil
}

// TestMinimalCapabilities runs attach, reattach, register, bypass dial,
// reload and status in a process limited to CAP_BPF and CAP_NET_ADMIN.
func TestMinimalCapabilities(t *testing.T) {
	requireBPF(t)
	testkit.NeedTool(t, "setpriv", "util-linux")
	ns := netnstest.New(t)
	root := netnstest.BPFFS(t) + "/rl-tproxy"
	upstream := listenTCP(t, ns, "tcp4", "127.0.0.1:0")
	serve(t, upstream, "upstream")
	cmd := ns.Command(context.Background(), "setpriv", "--no-new-privs",
		"--bounding-set=-all,+bpf,+net_admin", "--inh-caps=-all", "--",
		os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "RLTP_REDIRECT_HELPER=caps", "RLTP_PIN_ROOT="+root, "RLTP_UPSTREAM="+upstream.Addr().String())
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "caps ok") {
		t.Fatalf("with only CAP_BPF and CAP_NET_ADMIN: %v\n%s", err, out)
	}
}
