package rlclient

import (
	"os"
	"testing"

	"github.com/rl-tproxy/rl-tproxy/internal/testkit"
)

// The tests must leave no goroutine and no descriptor behind. Started by
// a client benchmark as its server child, the binary serves instead
// (benchsrv_test.go).
func TestMain(m *testing.M) {
	if nodes := os.Getenv(benchServerEnv); nodes != "" {
		os.Exit(benchServerMain(nodes))
	}
	testkit.VerifyMain(m)
}
