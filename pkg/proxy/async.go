package proxy

import "github.com/rl-tproxy/rl-tproxy/pkg/exchange"

// AsyncHook is an optional interface of a Hook for the event loops that
// serve HTTP/1.x: a loop thread must never block, so admission
// is split into Begin, which never blocks, and a later Resume.
//
// An exchange.Hook without this interface still works on the loops: the proxy
// runs Admit on a worker goroutine and hands the Decision back to the
// loop. Done is called as for Admit, exactly once for every request that
// reached Begin, after the response ended or failed.
type AsyncHook interface {
	exchange.Hook
	// Begin starts admission of r. It returns true when it decided at
	// once (*d filled; res is not used). Otherwise it returns false and
	// calls res.Resume exactly once later; *d is filled before that call.
	// r and d are owned by the proxy and stay valid, untouched by it,
	// until Resume; the Hook does not touch them after calling Resume.
	//
	// Resume may be called from any goroutine: from another one even
	// before Begin has returned, and from r.Loop's thread (in a later
	// turn, or from inside Cancel). The proxy therefore never continues
	// the request inside Resume: it queues it for r.Loop's thread (a
	// Resume on that thread is handled in the same turn). Begin itself
	// never calls Resume: it returns true instead.
	Begin(r *exchange.Request, d *exchange.Decision, res Resumer) bool
	// Cancel tells the Hook that the client of r went away while r's
	// admission is pending (Begin returned false, Resume not called
	// yet). The Hook finishes early (the Decision is then not used to
	// answer the client, but still reaches Done); it still calls Resume
	// exactly once, possibly from inside Cancel, and the proxy waits for
	// that before it reuses r or d. The proxy calls Cancel at most once
	// per Begin, on r.Loop's thread; Cancel does not block.
	Cancel(r *exchange.Request)
}

// Resumer is how an AsyncHook hands a pending admission back to the
// proxy. The proxy's implementation is per connection (no allocation
// per request).
type Resumer interface {
	Resume()
}

// LoopResumer is implemented by the proxy's Resumer: ResumeOnLoop is
// Resume for a Hook that is on r.Loop's thread outside any call from
// the proxy (not inside Begin or Cancel; e.g. from an evloop Watch
// callback or a function it Posted): the proxy continues the request
// inside the call, with no Post and no wake-up.
type LoopResumer interface {
	Resumer
	ResumeOnLoop()
}
