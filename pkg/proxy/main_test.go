package proxy

import (
	"os"
	"strconv"
	"testing"

	"github.com/rl-tproxy/rl-tproxy/internal/testkit"
)

// The tests must leave no goroutine and no descriptor behind.
// RL_TPROXY_EVENT_LOOPS=N runs them on the event-loop data path (every
// Config that leaves EventLoops 0 gets N).
func TestMain(m *testing.M) {
	if v := os.Getenv("RL_TPROXY_EVENT_LOOPS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil {
			panic("RL_TPROXY_EVENT_LOOPS: " + err.Error())
		}
		defaultEventLoops = n
	}
	testkit.VerifyMain(m)
}
