package node

import "fmt"

// KernelWait says when an idle event loop may wait for its next turn
// inside io_uring_enter or epoll_pwait2 holding its P instead of parking
// in Go's netpoller (`run --loop-kernel-wait`; docs/operations.md). A kernel wait
// is one system call and one sleep; a park is the netpoller's wait and two
// hand-offs of the loop's locked thread. Either way the loop waits only
// while no goroutine of the data path needs a P (proxy.Config.HoldP).
type KernelWait int

const (
	// KernelWaitLight, the default, waits in the kernel while the loop
	// has at most LightInFlight requests in progress: with few requests
	// every wait is a round trip a client waits for. One request at a
	// time it measured 0.56-0.72x the CPU per request of KernelWaitOff
	// at the same latency, and the same req/s, CPU and tail at 4 and 64
	// connections (docs/operations.md). Waiting in the kernel under load
	// too (a mode "always") measured no better than this and was
	// removed.
	KernelWaitLight KernelWait = iota
	// KernelWaitOff always parks, leaving the P to goroutines at once.
	KernelWaitOff
)

// LightInFlight is KernelWaitLight's bound on a loop's requests in
// progress (docs/bench/evloop.md has the measurement behind it).
const LightInFlight = 2

var kernelWaitNames = [...]string{KernelWaitOff: "off", KernelWaitLight: "light"}

func (k KernelWait) String() string {
	if k < 0 || int(k) >= len(kernelWaitNames) {
		return fmt.Sprintf("KernelWait(%d)", int(k))
	}
	return kernelWaitNames[k]
}

// ParseKernelWait reads a --loop-kernel-wait value: off or light.
func ParseKernelWait(s string) (KernelWait, error) {
	for k, name := range kernelWaitNames {
		if s == name {
			return KernelWait(k), nil
		}
	}
	if s == "always" {
		return 0, fmt.Errorf("loop kernel wait %q: want off or light (always measured no better than light and was removed)", s)
	}
	return 0, fmt.Errorf("loop kernel wait %q: want off or light", s)
}
