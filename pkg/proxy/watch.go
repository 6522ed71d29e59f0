package proxy

import (
	"time"

	"golang.org/x/sys/unix"
)

// The client-abort watcher. With a Hook, a watcher goroutine (from a pool,
// see admit.go) polls the client socket while the connection's goroutine
// does not read it: during Hook.Admit, and from the moment the whole
// request was sent upstream until the response was completely written.
// Without a Hook nobody observes Result, and nothing is watched (the
// request path keeps zero allocations; a write error still ends the
// exchange). A Hook that is an OnDemandWatcher has the admission watched
// only from its WatchClient call (when it is about to wait) and the
// response only when its Decision asks (WatchClient): the watcher costs
// a goroutine hand-off, a poll and deadline changes per request, which a
// request whose outcome does not depend on it need not pay.
//
// What counts as a client that went away:
//   - during admission: a reset, an error or a FIN (POLLRDHUP). The check's
//     context is cancelled and the request is not forwarded (as nginx does
//     with a closed client during a subrequest check).
//   - after admission, until the response was completely written: a reset
//     or an error (POLLERR/POLLHUP), or a failed write. The upstream
//     exchange is cancelled at once (its connection is closed, never
//     pooled). A FIN alone is not an abort: the client may have shut down
//     only its write side after a complete request, and it gets the
//     response. A client that closed fully answers the response's first
//     bytes with a reset; a later write fails, or the reset is found when
//     the watcher stops (a response that went out in one write before the
//     reset came back is the one case that stays undetected).
//
// Result.ClientAborted is set in all these cases; the admission layer then
// neither reports nor logs an allow.

const (
	watchAdmit int32 = iota
	watchResponse
)

// admit calls the hook while a watcher notices a client that goes away.
// With follow (an allowed request needs no more client reads before its
// response), the watcher keeps running into the response phase; the
// caller stops it with watchStop. With onDemand (the Hook is an
// OnDemandWatcher) nothing is watched unless Admit calls WatchClient or
// the Decision sets WatchClient.
func (c *conn) admit(hook Hook, follow, onDemand bool) Decision {
	c.gone.Store(false)
	c.actx.reset()
	if c.raw == nil {
		return hook.Admit(&c.actx, &c.req)
	}
	if !onDemand {
		c.watchStart(watchAdmit)
	}
	d := hook.Admit(&c.actx, &c.req)
	c.watchRsp = !onDemand || d.WatchClient
	if !c.watching {
		// Admit did not wait: nothing to cancel; watch from here on
		// only if the decision needs it.
		if d.Allow && follow && c.watchRsp {
			c.nc.SetReadDeadline(time.Time{})
			c.watchStart(watchResponse)
		}
		return d
	}
	if d.Allow && follow && c.watchRsp && !c.gone.Load() {
		// Watch on without the header deadline (the upstream exchange
		// has its own timeouts). A FIN from here on is no abort.
		c.wmode.Store(watchResponse)
		c.nc.SetReadDeadline(time.Time{})
		return d
	}
	c.watchStop()
	return d
}

// watchAdmitPhase starts watching during Hook.Admit (WatchClient), under
// the header deadline, unless a watcher runs already.
func (c *conn) watchAdmitPhase() {
	if c.raw == nil || c.watching {
		return
	}
	c.nc.SetReadDeadline(c.admitDL)
	c.watchStart(watchAdmit)
}

// watchStart starts a watcher for c in mode.
func (c *conn) watchStart(mode int32) {
	c.fin = false
	c.wmode.Store(mode)
	c.watching = true
	c.p.watchers.start(c)
}

// watchResponsePhase starts watching for the response phase (a request
// whose body was read from the client after admission). Only with a Hook,
// and one that is no OnDemandWatcher or whose Decision set WatchClient.
func (c *conn) watchResponsePhase() {
	if !c.watchRsp || c.raw == nil || c.watching {
		return
	}
	c.gone.Store(false)
	c.nc.SetReadDeadline(time.Time{})
	c.watchStart(watchResponse)
}

// watchStop wakes the watcher, waits for it and reports whether the client
// went away. It is a no-op when no watcher runs.
func (c *conn) watchStop() bool {
	if !c.watching {
		return c.gone.Load()
	}
	c.wmu.Lock()
	c.wup = nil
	c.wmu.Unlock()
	c.nc.SetReadDeadline(aLongTimeAgo) // wake the watcher
	<-c.watchDone
	c.nc.SetReadDeadline(time.Time{})
	c.watching = false
	if c.fin && !c.gone.Load() && c.resetPending() {
		c.gone.Store(true)
	}
	return c.gone.Load()
}

// attachUp lets the watcher cancel the exchange on u's connection; it
// reports true when the client is already gone.
func (c *conn) attachUp(u *upConn) bool {
	if !c.watching {
		return false
	}
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if c.gone.Load() {
		return true
	}
	c.wup = u.nc
	return false
}

// detachUp takes the upstream connection away from the watcher (before it
// is pooled or closed) and reports whether the client went away, in which
// case the watcher may have closed it.
func (c *conn) detachUp() bool {
	if !c.watching {
		return false
	}
	c.wmu.Lock()
	defer c.wmu.Unlock()
	c.wup = nil
	return c.gone.Load()
}

// markGone runs on the watcher: the client went away.
func (c *conn) markGone() {
	c.wmu.Lock()
	c.gone.Store(true)
	if c.wup != nil {
		c.wup.Close() // cancels the upstream exchange; its reader sees an error
		c.wup = nil
	}
	c.wmu.Unlock()
}

// watch runs on a watcher goroutine until the client goes away or
// watchStop wakes it (or, during admission, the header deadline passes).
func (c *conn) watch() {
	c.raw.Read(c.peekFn)
	if c.gone.Load() {
		c.actx.cancel()
	}
}

// peekReady runs inside the poller while c is watched: it reports the
// client gone on a hang-up, reset or error, and during admission also on a
// half-close (POLLRDHUP); otherwise it keeps waiting, also while request
// body or pipelined bytes sit unread (each new arrival, the FIN or a reset
// wakes it again).
func (c *conn) peekReady(fd uintptr) bool {
	c.pfd[0] = unix.PollFd{Fd: int32(fd), Events: unix.POLLIN | unix.POLLRDHUP}
	n, err := unix.Poll(c.pfd[:], 0)
	if err != nil || n == 0 {
		return false
	}
	rev := c.pfd[0].Revents
	if rev&(unix.POLLHUP|unix.POLLERR|unix.POLLNVAL) != 0 ||
		rev&unix.POLLRDHUP != 0 && c.wmode.Load() == watchAdmit {
		c.markGone()
		return true
	}
	if rev&unix.POLLRDHUP != 0 {
		c.fin = true
	}
	return false
}

// resetPending reports whether a reset or error is queued on the client
// socket (checked once after the response, for a client that sent a FIN).
func (c *conn) resetPending() bool {
	reset := false
	c.raw.Control(func(fd uintptr) {
		pfd := [1]unix.PollFd{{Fd: int32(fd), Events: unix.POLLRDHUP}}
		n, err := unix.Poll(pfd[:], 0)
		reset = err == nil && n > 0 && pfd[0].Revents&(unix.POLLHUP|unix.POLLERR) != 0
	})
	return reset
}
