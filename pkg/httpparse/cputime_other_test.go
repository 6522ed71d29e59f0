//go:build !linux

package httpparse

import "testing"

func measureCPU(b *testing.B, loop func()) { loop() }
