package evloop

// Timer runs a function on its loop's thread at a deadline. Embed it in
// the state it belongs to: Init once, then Reset and Stop as often as
// needed without allocating. Loop thread only.
type Timer struct {
	l   *Loop
	fn  func()
	at  int64
	idx int // position in the loop's heap, -1: not armed
}

// Init binds t to l and fn; t starts stopped.
func (t *Timer) Init(l *Loop, fn func()) {
	t.l, t.fn, t.idx = l, fn, -1
}

// Reset arms t for the absolute time at (Loop.Now's clock); a deadline in
// the past fires in the next turn.
func (t *Timer) Reset(at int64) {
	t.at = at
	h := &t.l.timers
	if t.idx >= 0 {
		if !t.l.up(t.idx) {
			t.l.down(t.idx)
		}
		return
	}
	t.idx = len(*h)
	*h = append(*h, t)
	t.l.up(t.idx)
}

// Stop disarms t; its function does not run after Stop returns.
func (t *Timer) Stop() {
	if t.l == nil || t.idx < 0 {
		return
	}
	t.l.removeTimer(t.idx)
}

// Armed reports whether t will fire.
func (t *Timer) Armed() bool { return t.l != nil && t.idx >= 0 }

func (l *Loop) removeTimer(i int) {
	h := l.timers
	n := len(h) - 1
	t := h[i]
	if i != n {
		h[i] = h[n]
		h[i].idx = i
	}
	h[n] = nil
	l.timers = h[:n]
	if i != n {
		if !l.up(i) {
			l.down(i)
		}
	}
	t.idx = -1
}

// up moves timer i towards the root; it reports whether it moved.
func (l *Loop) up(i int) bool {
	h := l.timers
	moved := false
	for i > 0 {
		p := (i - 1) / 2
		if h[p].at <= h[i].at {
			break
		}
		h[p], h[i] = h[i], h[p]
		h[p].idx, h[i].idx = p, i
		i = p
		moved = true
	}
	return moved
}

func (l *Loop) down(i int) {
	h := l.timers
	n := len(h)
	for {
		c := 2*i + 1
		if c >= n {
			return
		}
		if r := c + 1; r < n && h[r].at < h[c].at {
			c = r
		}
		if h[i].at <= h[c].at {
			return
		}
		h[i], h[c] = h[c], h[i]
		h[i].idx, h[c].idx = i, c
		i = c
	}
}

// runTimers fires every timer due at l.now.
func (l *Loop) runTimers() {
	for n := len(l.timers); n > 0 && len(l.timers) > 0 && l.timers[0].at <= l.now; n-- {
		t := l.timers[0]
		l.removeTimer(0)
		t.fn()
	}
}
