package httpparse

import (
	"runtime"
	"testing"

	"golang.org/x/sys/unix"
)

// threadCPU returns the CPU time consumed by the calling OS thread.
func threadCPU() int64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_THREAD_CPUTIME_ID, &ts); err != nil {
		return 0
	}
	return ts.Nano()
}

// measureCPU runs loop with the goroutine locked to its thread and reports
// the thread's CPU time per op as "cpu-ns/op": on a shared, overloaded
// machine wall-clock ns/op mostly measures waiting for a CPU. Background GC
// work on other threads is not counted (which favours the allocating side).
func measureCPU(b *testing.B, loop func()) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	t0 := threadCPU()
	loop()
	if b.N > 0 {
		b.ReportMetric(float64(threadCPU()-t0)/float64(b.N), "cpu-ns/op")
	}
}
