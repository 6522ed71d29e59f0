package evloop

import (
	"sync/atomic"
	"time"
)

// A loop parked in the netpoller is woken only when some thread polls the
// network: an M that found nothing to run blocks in the netpoller's
// epoll_wait, and sysmon polls it when nobody has for 10 ms. A loop that
// holds its P without entering the scheduler is counted as running: in a
// kernel wait (a raw system call) or in its turn. So the scheduler can
// find no reason to start an M for a parked loop beside it, and the
// parked loop's readiness then waits for sysmon or for the other loop's
// next park: 10-20 ms. Two moments leave a parked loop so:
//
//   - a loop parks while another waits in the kernel, or starts a kernel
//     wait while another is parked (measured: max 19-39 ms at 4
//     keep-alive connections, unpinned);
//   - a loop resumes from a park while another is parked: the M that
//     polled and found it hands its P to the loop's own thread (the
//     goroutine is locked to it) and stops, so nobody polls any more
//     (measured: a function posted to the parked loop waited 10-17 ms
//     while the resumed one stayed busy for 30 ms;
//     TestWokenLoopKicksForParkedLoop).
//
// At each, the loop wakes the group's kicker goroutine: the wake-up makes
// the runtime start an M for it (wakep), and that M, with nothing else to
// run, blocks in the netpoller. After a resume the kick waits
// resumeKickAfter: a loop that parks again or starts a kernel wait
// within it needs none (the park hands its P to an M that polls; the
// kernel wait kicks), which is every cycle at a few connections, where a
// kick at each resume cost 0.3 context switches per request more.

// resumeKickAfter is how long a loop that resumed from a park holds its P
// (busy, turn after turn) before it kicks for parked loops: what such a
// loop may add to another's wake-up, beside the turn in progress.
const resumeKickAfter = int64(200 * time.Microsecond)

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
