package h2proxy

import (
	"context"
	"sync"
	"time"
)

// deadlineCtx is the context a exchange.ContextBound Hook's Admit gets: the
// stream's context plus the admission deadline, pooled with the stream
// and made without allocating until someone waits on it. Done makes the
// channel, arms the reused timer for the deadline and follows the
// stream's context (context.AfterFunc); a Hook that decides at once (a
// location without admission) never calls it, and Err compares the
// clock with the deadline itself. context.WithTimeout cost 6 allocations
// and a timer per stream, waited on or not.
type deadlineCtx struct {
	mu       sync.Mutex
	parent   context.Context
	deadline time.Time
	done     chan struct{}
	err      error
	timer    *time.Timer // made on the first Done, then Reset
	stop     func() bool // context.AfterFunc's, on parent
	onParent func()      // c.cancelParent, made once
}

// start readies c for one admission.
func (c *deadlineCtx) start(parent context.Context, deadline time.Time) {
	c.mu.Lock()
	c.parent, c.deadline, c.done, c.err = parent, deadline, nil, nil
	c.mu.Unlock()
}

// finish ends c's use (Admit returned): the timer and the parent watch
// stop. A timer or parent callback already running finds nothing to do
// (expire compares the clock with the deadline of the admission then
// current, cancelParent that admission's parent).
func (c *deadlineCtx) finish() {
	c.mu.Lock()
	if c.timer != nil {
		c.timer.Stop()
	}
	if c.stop != nil {
		c.stop()
		c.stop = nil
	}
	c.parent = nil
	c.mu.Unlock()
}

func (c *deadlineCtx) Deadline() (time.Time, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.deadline, true
}

func (c *deadlineCtx) Value(key any) any {
	c.mu.Lock()
	p := c.parent
	c.mu.Unlock()
	if p == nil {
		return nil
	}
	return p.Value(key)
}

func (c *deadlineCtx) Done() <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.done != nil {
		return c.done
	}
	// Ended before anyone waited (parent gone, deadline passed): the
	// check runs while done is still nil, so cancelLocked does not close
	// the channel made below, closed here once.
	c.checkLocked()
	c.done = make(chan struct{})
	if c.err != nil {
		close(c.done)
		return c.done
	}
	d := time.Until(c.deadline)
	if c.timer == nil {
		c.timer = time.AfterFunc(d, c.expire)
	} else {
		c.timer.Reset(d)
	}
	if c.onParent == nil {
		c.onParent = c.cancelParent
	}
	if c.parent != nil {
		c.stop = context.AfterFunc(c.parent, c.onParent)
	}
	return c.done
}

func (c *deadlineCtx) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.checkLocked()
	return c.err
}

// checkLocked ends c when its parent ended or its deadline passed.
func (c *deadlineCtx) checkLocked() {
	if c.err != nil {
		return
	}
	if c.parent != nil {
		if err := c.parent.Err(); err != nil {
			c.cancelLocked(err)
			return
		}
	}
	if !time.Now().Before(c.deadline) {
		c.cancelLocked(context.DeadlineExceeded)
	}
}

func (c *deadlineCtx) expire() {
	c.mu.Lock()
	if c.parent != nil && !time.Now().Before(c.deadline) {
		c.cancelLocked(context.DeadlineExceeded)
	}
	c.mu.Unlock()
}

func (c *deadlineCtx) cancelParent() {
	c.mu.Lock()
	if c.parent != nil {
		if err := c.parent.Err(); err != nil {
			c.cancelLocked(err)
		}
	}
	c.mu.Unlock()
}

func (c *deadlineCtx) cancelLocked(err error) {
	if c.err != nil {
		return
	}
	c.err = err
	if c.done != nil {
		close(c.done)
	}
}
