package h1client_test

import (
	"testing"

	"github.com/rl-tproxy/rl-tproxy/internal/testkit"
)

func TestMain(m *testing.M) { testkit.VerifyMain(m) }
