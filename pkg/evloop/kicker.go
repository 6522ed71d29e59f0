package evloop

import "sync/atomic"

// A loop parked in the netpoller is woken only when some thread polls the
// network: an M that found nothing to run blocks in the netpoller's
// epoll_wait, and sysmon polls it when nobody has for 10 ms. A loop in a
// kernel wait holds its P inside a raw system call, which the runtime
// counts as running, so when another loop parks meanwhile the scheduler
// can find no reason to start an M that would block in the netpoller:
// the parked loop's readiness then waits for sysmon, 10-20 ms (measured:
// max 19-39 ms at 4 keep-alive connections, unpinned). So a loop that
// parks while another waits in the kernel, and one that starts a kernel
// wait while another is parked, wakes the group's kicker goroutine: the
// wake-up makes the runtime start an M for it (wakep), and that M, with
// nothing else to run, blocks in the netpoller. Epoll-only groups and
// --loop-kernel-wait off never have a loop in a kernel wait, so they
// never kick.

// loopsInKernel and loopsParked count the process's loops in a kernel
// wait and parked in the netpoller.
var loopsInKernel, loopsParked atomic.Int32

// kicker runs until the group closes; each wake-up is all it does.
func (g *Group) kicker() {
	defer g.wg.Done()
	for {
		select {
		case <-g.kick:
		case <-g.done:
			return
		}
	}
}

// kickNetpoll wakes the kicker unless a wake-up is already pending; any
// goroutine, never blocks.
func (g *Group) kickNetpoll() {
	g.nKicks.Add(1)
	select {
	case g.kick <- struct{}{}:
	default:
	}
}
