package node

import "fmt"

// KernelWait says when an idle event loop may wait for its next turn
// inside io_uring_enter holding its P instead of parking in Go's
// netpoller (`run --loop-kernel-wait`; docs/operations.md). A kernel wait
// is one system call and one sleep; a park is the netpoller's wait and two
// hand-offs of the loop's locked thread. Either way the loop waits only
// while no goroutine of the data path needs a P (proxy.Config.HoldP).
type KernelWait int

const (
	// KernelWaitLight, the default, waits in the kernel while the loop
	// has at most LightInFlight requests in progress: with few requests
	// every wait is a round trip a client waits for, while under load the
	// park's slower wake-up lets a turn take more completions at once,
	// which measured cheaper with admission. One request at a time it
	// measured 0.59x (unprotected) and 0.76x (admission) the CPU per
	// request of KernelWaitOff at the same latency, and the same req/s and
	// CPU at wrk -c64 (docs/bench/evloop.md).
	KernelWaitLight KernelWait = iota
	// KernelWaitOff always parks, leaving the P to goroutines at once.
	KernelWaitOff
	// KernelWaitAlways waits in the kernel whatever the load.
	KernelWaitAlways
)

// LightInFlight is KernelWaitLight's bound on a loop's requests in
// progress (docs/bench/evloop.md has the measurement behind it).
const LightInFlight = 2

var kernelWaitNames = [...]string{KernelWaitOff: "off", KernelWaitLight: "light", KernelWaitAlways: "always"}

func (k KernelWait) String() string {
	if k < 0 || int(k) >= len(kernelWaitNames) {
		return fmt.Sprintf("KernelWait(%d)", int(k))
	}
	return kernelWaitNames[k]
}

// ParseKernelWait reads a --loop-kernel-wait value: off, light or always.
func ParseKernelWait(s string) (KernelWait, error) {
	for k, name := range kernelWaitNames {
		if s == name {
			return KernelWait(k), nil
		}
	}
	return 0, fmt.Errorf("loop kernel wait %q: want off, light or always", s)
}
