package asynclog

import (
	"testing"

	"github.com/rl-tproxy/rl-tproxy/internal/testkit"
)

// The tests must leave no goroutine and no descriptor behind.
func TestMain(m *testing.M) { testkit.VerifyMain(m) }
