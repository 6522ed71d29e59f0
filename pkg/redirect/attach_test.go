package redirect

import (
	"testing"

	"github.com/rl-tproxy/rl-tproxy/internal/netnstest"
)

func TestAttachSmoke(t *testing.T) {
	requireRoot(t)
	ns := netnstest.New(t)
	r := attachIn(t, ns, Config{Ports: []uint16{80}})
	t.Log(r.Dir(), r.ProgramTag())
}
