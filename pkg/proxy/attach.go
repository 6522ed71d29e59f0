package proxy

import (
	"errors"
	"fmt"
	"sync"

	"github.com/rl-tproxy/rl-tproxy/pkg/evloop"
)

// A LoopAttacher is given each event loop of the proxy once, on that loop's thread
// (from a function Posted to the loop), before the loop accepts connections when the
// loops start after Attach, or at once when they already run.
type LoopAttacher interface {
	// AttachLoop runs on l's thread. detach (may be nil) is called on l's thread when the
	// loops stop (Shutdown/Close, after the loop's connections are gone), before the
	// evloop group closes, or earlier by Proxy.Detach.
	AttachLoop(l *evloop.Loop) (detach func(), err error)
}

// attachment is one Attach: its attacher and, by loop ID, the detach
// function AttachLoop returned on that loop (written and read only on
// that loop's thread, or after waiting for it).
type attachment struct {
	a      LoopAttacher
	detach []func()
}

// Attach registers a: if the loops run, AttachLoop runs now on every loop (Attach waits);
// otherwise when they start. An error from any loop detaches the loops already attached
// and is returned (or, when the loops start later, fails that start with context).
//
// Attach after Shutdown returns ErrClosed.
func (p *Proxy) Attach(a LoopAttacher) error {
	if a == nil {
		return errors.New("proxy: Attach(nil)")
	}
	lg := p.lg
	lg.shutMu.Lock() // no Shutdown between the check and the attach
	defer lg.shutMu.Unlock()
	if lg.stopped || p.shutdown.Load() {
		return ErrClosed
	}
	at := &attachment{a: a}
	lg.mu.Lock()
	lg.attached = append(lg.attached, at)
	lg.nAttached.Store(int64(len(lg.attached)))
	loops := lg.loops
	started := lg.g != nil
	lg.mu.Unlock()
	if !started {
		return nil // start runs it
	}
	if err := at.attachAll(loops); err != nil {
		lg.mu.Lock()
		for i, x := range lg.attached {
			if x == at {
				lg.attached = append(lg.attached[:i], lg.attached[i+1:]...)
				lg.nAttached.Store(int64(len(lg.attached)))
				break
			}
		}
		lg.mu.Unlock()
		return err
	}
	return nil
}

// Detach undoes Attach(a) before the loops stop: a's detach functions
// run now on every loop (Detach waits) and a is forgotten, so a replaced
// attacher (a RateLimitly client or embedded server swapped on reload)
// costs the loops nothing and stays referenced by nothing. Detach of an
// attacher that is not attached (or after Shutdown detached everything)
// does nothing. It must not be called from a loop's thread.
func (p *Proxy) Detach(a LoopAttacher) {
	lg := p.lg
	lg.shutMu.Lock() // not while Shutdown detaches
	defer lg.shutMu.Unlock()
	lg.mu.Lock()
	var at *attachment
	for i, x := range lg.attached {
		if x.a == a {
			at = x
			lg.attached = append(lg.attached[:i:i], lg.attached[i+1:]...)
			lg.nAttached.Store(int64(len(lg.attached)))
			break
		}
	}
	loops, started := lg.loops, lg.g != nil
	lg.mu.Unlock()
	if at == nil || !started || lg.stopped {
		return
	}
	onEach(loops, func(ls *loopState) { at.detachLoop(ls.l.ID()) })
}

// attachAll runs AttachLoop on every loop and waits; on an error it runs
// the detach functions of the loops that succeeded and returns the first
// error.
func (at *attachment) attachAll(loops []*loopState) error {
	at.detach = make([]func(), len(loops))
	errs := make([]error, len(loops))
	onEach(loops, func(ls *loopState) {
		id := ls.l.ID()
		d, err := at.a.AttachLoop(ls.l)
		if err != nil {
			errs[id] = fmt.Errorf("proxy: attach %T to event loop %d: %w", at.a, id, err)
			if d != nil {
				d() // a failed attach owes nothing, but do not leak what it returned
			}
			return
		}
		at.detach[id] = d
	})
	err := errors.Join(errs...)
	if err != nil {
		onEach(loops, func(ls *loopState) { at.detachLoop(ls.l.ID()) })
	}
	return err
}

// detachLoop runs the detach function of loop id once; loop id's thread.
func (at *attachment) detachLoop(id int) {
	if id < len(at.detach) {
		if d := at.detach[id]; d != nil {
			at.detach[id] = nil
			d()
		}
	}
}

// attachStarted runs every registered attacher on the just-started loops
// (start; lg.mu is held). On an error the attachers already run are
// detached.
func (lg *loopGroup) attachStarted(loops []*loopState) error {
	for i, at := range lg.attached {
		if err := at.attachAll(loops); err != nil {
			for j := i - 1; j >= 0; j-- {
				prev := lg.attached[j]
				onEach(loops, func(ls *loopState) { prev.detachLoop(ls.l.ID()) })
			}
			return err
		}
	}
	return nil
}

// detachAll runs, on every loop, the detach functions of every attacher,
// the last attached first (shutdown, once the loops' connections are
// gone).
func (lg *loopGroup) detachAll() {
	lg.mu.Lock()
	atts := append([]*attachment(nil), lg.attached...)
	lg.mu.Unlock()
	lg.each(func(ls *loopState) {
		for i := len(atts) - 1; i >= 0; i-- {
			atts[i].detachLoop(ls.l.ID())
		}
	})
}

// onEach runs fn on every loop's thread and waits for all of them.
func onEach(loops []*loopState, fn func(ls *loopState)) {
	var wg sync.WaitGroup
	for _, ls := range loops {
		wg.Add(1)
		ls.l.Post(func() { defer wg.Done(); fn(ls) })
	}
	wg.Wait()
}
