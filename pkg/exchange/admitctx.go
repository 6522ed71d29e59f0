package exchange

import (
	"context"
	"sync"
	"time"
)

// AdmitContext is the context a Hook's Admit gets on every path: it ends
// when the admission deadline passes (context.DeadlineExceeded), when
// its parent ends (an HTTP/2 stream's context: the client reset the
// stream), or when its owner cancels it (Cancel: the client went away,
// or the owner's own deadline timer fired first).
//
// It is made for reuse by one owner, one admission at a time (an
// HTTP/1.x connection's requests, an HTTP/2 stream pool's streams):
// Start readies it, Finish ends its use once Admit returned, and a Hook
// must not keep it after Admit returns. Until someone waits on it, it
// costs no allocation: Done makes the channel, arms the reused timer for
// the deadline and follows the parent (context.AfterFunc); a Hook that
// decides at once never calls Done, and Err compares the clock with the
// deadline itself. context.WithTimeout costs six allocations and a timer
// per admission, waited on or not.
//
// The zero value is an ended context without a deadline: Start it
// first.
type AdmitContext struct {
	mu       sync.Mutex
	active   bool // between Start and Finish
	parent   context.Context
	deadline time.Time
	done     chan struct{}
	err      error
	timer    *time.Timer // made on the first Done, then Reset
	stop     func() bool // context.AfterFunc's, on parent
	onParent func()      // c.cancelParent, made once
}

// Start readies c for one admission that must decide before deadline;
// it also ends with parent (context.Background() for none).
func (c *AdmitContext) Start(parent context.Context, deadline time.Time) {
	c.mu.Lock()
	c.active, c.parent, c.deadline, c.done, c.err = true, parent, deadline, nil, nil
	c.mu.Unlock()
}

// Cancel ends the admission with err (context.Canceled: the client went
// away; context.DeadlineExceeded: the owner's deadline timer fired). A
// context already ended keeps its first error.
func (c *AdmitContext) Cancel(err error) {
	c.mu.Lock()
	c.cancelLocked(err)
	c.mu.Unlock()
}

// Finish ends c's use (Admit returned): its timer and its watch of the
// parent stop. A timer or parent callback already running finds nothing
// to do: expire compares the clock with the deadline of the admission
// then current, cancelParent that admission's parent.
func (c *AdmitContext) Finish() {
	c.mu.Lock()
	if c.timer != nil {
		c.timer.Stop()
	}
	if c.stop != nil {
		c.stop()
		c.stop = nil
	}
	c.active, c.parent = false, nil
	c.mu.Unlock()
}

// Deadline implements context.Context.
func (c *AdmitContext) Deadline() (time.Time, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.deadline, !c.deadline.IsZero()
}

// Value implements context.Context: the parent's values.
func (c *AdmitContext) Value(key any) any {
	c.mu.Lock()
	p := c.parent
	c.mu.Unlock()
	if p == nil {
		return nil
	}
	return p.Value(key)
}

// Done implements context.Context.
func (c *AdmitContext) Done() <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.done != nil {
		return c.done
	}
	// Ended before anyone waited (parent gone, deadline passed,
	// cancelled): the check runs while done is still nil, so
	// cancelLocked does not close the channel made below, closed here
	// once.
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

// Err implements context.Context.
func (c *AdmitContext) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.checkLocked()
	return c.err
}

// checkLocked ends an active c when its parent ended or its deadline
// passed.
func (c *AdmitContext) checkLocked() {
	if c.err != nil {
		return
	}
	if !c.active {
		c.cancelLocked(context.Canceled)
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

// expire is the deadline timer's function.
func (c *AdmitContext) expire() {
	c.mu.Lock()
	if c.active && !time.Now().Before(c.deadline) {
		c.cancelLocked(context.DeadlineExceeded)
	}
	c.mu.Unlock()
}

// cancelParent is the parent watch's function.
func (c *AdmitContext) cancelParent() {
	c.mu.Lock()
	if c.active && c.parent != nil {
		if err := c.parent.Err(); err != nil {
			c.cancelLocked(err)
		}
	}
	c.mu.Unlock()
}

func (c *AdmitContext) cancelLocked(err error) {
	if c.err != nil {
		return
	}
	c.err = err
	if c.done != nil {
		close(c.done)
	}
}
