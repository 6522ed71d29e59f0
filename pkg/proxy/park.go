package proxy

import (
	"os"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Idle parking: a keep-alive connection that stays idle for
// Config.ParkIdleAfter gives up its goroutine (and stack); its socket waits
// in one shared epoll set instead. A read-ready event (a request, a close)
// hands it back to a new goroutine. Busy connections never park, so the
// request path pays nothing for it.
//
// Ownership follows conn.state: the connection's goroutine owns it while
// active or idle; the parker owns it while parked; transitions into and out
// of stateParked happen under parker.mu.

const stateParked int32 = 3

// DefaultParkIdleAfter is the idle time after which a connection parks.
const DefaultParkIdleAfter = 100 * time.Millisecond

type parker struct {
	mu      sync.Mutex
	started bool
	closed  bool
	epfd    int
	file    *os.File // epfd registered with Go's poller
	raw     syscall.RawConn
	slots   []*conn
	free    []int32
	events  [64]unix.EpollEvent
	nready  int
	sweep   time.Duration // parked idle-timeout sweep interval
	stopped chan struct{} // closed when both parker goroutines ended
	quit    chan struct{}
}

// start creates the epoll set and its goroutines (once).
func (pk *parker) start(sweep time.Duration) error {
	if pk.started {
		return nil
	}
	epfd, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return err
	}
	if err := unix.SetNonblock(epfd, true); err != nil {
		unix.Close(epfd)
		return err
	}
	f := os.NewFile(uintptr(epfd), "proxy-park-epoll")
	raw, err := f.SyscallConn()
	if err != nil {
		f.Close()
		return err
	}
	pk.epfd, pk.file, pk.raw, pk.started = epfd, f, raw, true
	pk.quit = make(chan struct{})
	pk.stopped = make(chan struct{})
	if pk.sweep = sweep; pk.sweep <= 0 {
		pk.sweep = time.Second
	}
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); pk.loop() }()
	go func() { defer wg.Done(); pk.sweeper() }()
	go func() { wg.Wait(); close(pk.stopped) }()
	return nil
}

// park hands c (idle, no buffers) to the epoll set. It reports false when
// parking is not possible (the caller keeps waiting itself) and sets
// *closed when Shutdown already claimed the connection.
func (pk *parker) park(c *conn) (parked, closed bool) {
	pk.mu.Lock()
	defer pk.mu.Unlock()
	if pk.closed || c.fd < 0 {
		return false, false
	}
	if err := pk.start(c.p.cfg.Load().testParkSweep); err != nil {
		return false, false
	}
	var slot int32
	if n := len(pk.free); n > 0 {
		slot = pk.free[n-1]
		pk.free = pk.free[:n-1]
	} else {
		slot = int32(len(pk.slots))
		pk.slots = append(pk.slots, nil)
	}
	if !c.state.CompareAndSwap(stateIdle, stateParked) {
		pk.free = append(pk.free, slot)
		return false, true
	}
	ev := unix.EpollEvent{Events: unix.EPOLLIN | unix.EPOLLRDHUP | unix.EPOLLONESHOT, Fd: slot}
	if err := unix.EpollCtl(pk.epfd, unix.EPOLL_CTL_ADD, c.fd, &ev); err != nil {
		c.state.Store(stateIdle)
		pk.free = append(pk.free, slot)
		return false, false
	}
	pk.slots[slot] = c
	c.slot = slot
	if f := c.p.cfg.Load().testOnPark; f != nil {
		f()
	}
	return true, false
}

// unparkLocked removes c from the set; pk.mu is held.
func (pk *parker) unparkLocked(c *conn) {
	unix.EpollCtl(pk.epfd, unix.EPOLL_CTL_DEL, c.fd, nil)
	pk.slots[c.slot] = nil
	pk.free = append(pk.free, c.slot)
	c.slot = -1
}

func (pk *parker) loop() {
	for {
		err := pk.raw.Read(func(fd uintptr) bool {
			n, err := unix.EpollWait(int(fd), pk.events[:], 0)
			if err != nil || n <= 0 {
				return err != nil && err != unix.EINTR && err != unix.EAGAIN
			}
			pk.nready = n
			return true
		})
		if err != nil {
			return
		}
		n := pk.nready
		pk.nready = 0
		var wake []*conn
		var buf [64]*conn
		wake = buf[:0]
		pk.mu.Lock()
		if pk.closed {
			pk.mu.Unlock()
			return
		}
		for i := 0; i < n; i++ {
			slot := pk.events[i].Fd
			if int(slot) >= len(pk.slots) {
				continue
			}
			c := pk.slots[slot]
			if c == nil || !c.state.CompareAndSwap(stateParked, stateActive) {
				continue
			}
			pk.unparkLocked(c)
			wake = append(wake, c)
		}
		pk.mu.Unlock()
		for _, c := range wake {
			go c.serve()
		}
	}
}

// sweeper closes parked connections whose idle timeout passed.
func (pk *parker) sweeper() {
	t := time.NewTicker(pk.sweep)
	defer t.Stop()
	for {
		select {
		case <-pk.quit:
			return
		case now := <-t.C:
			var expired []*conn
			pk.mu.Lock()
			for _, c := range pk.slots {
				if c != nil && now.After(c.idleDeadline) && c.state.CompareAndSwap(stateParked, stateClosed) {
					pk.unparkLocked(c)
					expired = append(expired, c)
				}
			}
			pk.mu.Unlock()
			for _, c := range expired {
				c.finish()
			}
		}
	}
}

// closeParked closes every parked connection (drain), except fresh ones
// that may still wait for their first request at now (zero now: all).
func (pk *parker) closeParked(now time.Time) {
	var all []*conn
	pk.mu.Lock()
	for _, c := range pk.slots {
		if c != nil && !now.IsZero() && c.waitsFirst(now) {
			continue
		}
		if c != nil && c.state.CompareAndSwap(stateParked, stateClosed) {
			pk.unparkLocked(c)
			all = append(all, c)
		}
	}
	pk.mu.Unlock()
	for _, c := range all {
		c.finish()
	}
}

// stop ends the parker goroutines (after closeParked) and waits for them.
func (pk *parker) stop() {
	pk.mu.Lock()
	if pk.closed {
		pk.mu.Unlock()
		return
	}
	pk.closed = true
	started := pk.started
	if started {
		close(pk.quit)
		pk.file.Close() // wakes loop with an error
	}
	pk.mu.Unlock()
	if started {
		<-pk.stopped
	}
}

// parkedCount is the number of parked connections.
func (pk *parker) parkedCount() int {
	pk.mu.Lock()
	defer pk.mu.Unlock()
	return len(pk.slots) - len(pk.free)
}
