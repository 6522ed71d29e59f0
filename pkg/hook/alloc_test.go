//go:build !race

// Allocation tests (testing.AllocsPerRun). Their counts are meaningless
// under -race (the detector allocates, sync.Pool drops items), so this file
// is left out of the race run and `make test-alloc` runs it without -race.
// Every test here has "Alloc" in its name: that pass selects them by it.

package hook

import (
	"context"
	"testing"
	"time"

	"github.com/rl-tproxy/rl-tproxy/pkg/admission"
	"github.com/rl-tproxy/rl-tproxy/pkg/exchange"
	"github.com/rl-tproxy/rl-tproxy/pkg/ratelimitly"
	"github.com/rl-tproxy/rl-tproxy/pkg/ratelimitly/wire"
)

// Admit and Done, and Begin and Done, allocate nothing in steady state
// (access log off), for allows and for denies with their answer headers.
func TestAdmitDoneNoAlloc(t *testing.T) {
	for _, c := range []struct {
		name string
		fn   func(context.Context, *wire.RateRequest, *admission.CheckResult)
		fail string
	}{{"allow", allowAll, "close"}, {"deny", denyResource, "close"}, {"fail", failWith(ratelimitly.CauseTimeout), "close"},
		{"local", failWith(ratelimitly.CauseNoEndpoints), "local"}} {
		g, r := quietGate(t, c.fail, c.fn)
		ctx := context.Background()
		res := &exchange.Result{Status: 200, End: time.Now()}
		run := func() {
			d := g.Admit(ctx, r)
			g.Done(r, &d, res)
		}
		run()
		if n := testing.AllocsPerRun(200, run); n != 0 {
			t.Errorf("%s: Admit+Done allocate %v per request", c.name, n)
		}
		// Begin, with a checker that completes on another goroutine (as
		// the rlclient Client does) and a Resumer the caller owns.
		f := startAsyncFake(t, c.fn)
		g.SetChecker(f, nil)
		d := new(exchange.Decision)
		w := &chanResumer{ch: make(chan struct{}, 1)}
		run = func() {
			if g.Begin(r, d, w) {
				t.Fatal("a protected request decided without its check")
			}
			<-w.ch
			g.Done(r, d, res)
		}
		run()
		if n := testing.AllocsPerRun(200, run); n != 0 {
			t.Errorf("%s: Begin+Done allocate %v per request", c.name, n)
		}
	}
}

// An allow that carries the RateLimit fields (ratelimit_headers: all)
// allocates nothing either, through Admit and through Begin.
func TestAdmitDoneRateLimitFieldsNoAlloc(t *testing.T) {
	g, r := quietGate(t, "close", allowOneLeft)
	g.Swap(allPolicy(t, "close", "127.0.0.1:9"))
	ctx := context.Background()
	res := &exchange.Result{Status: 200, End: time.Now()}
	var d exchange.Decision
	run := func() {
		d = g.Admit(ctx, r)
		if len(d.Header) != 2 {
			t.Fatalf("allow carries %d fields, want RateLimit-Policy and RateLimit", len(d.Header))
		}
		g.Done(r, &d, res)
	}
	run()
	if n := testing.AllocsPerRun(200, run); n != 0 {
		t.Errorf("Admit+Done allocate %v per request", n)
	}
	f := startAsyncFake(t, allowOneLeft)
	g.SetChecker(f, nil)
	w := &chanResumer{ch: make(chan struct{}, 1)}
	run = func() {
		if g.Begin(r, &d, w) {
			t.Fatal("a protected request decided without its check")
		}
		<-w.ch
		if len(d.Header) != 2 || string(d.Header[1].Value) != `"per_key";r=1;t=1` {
			t.Fatalf("allow fields %q", d.Header)
		}
		g.Done(r, &d, res)
	}
	run()
	if n := testing.AllocsPerRun(200, run); n != 0 {
		t.Errorf("Begin+Done allocate %v per request", n)
	}
}

// asyncFake is an asyncChecker that answers with fn on its own
// goroutine, like the rlclient Client's receive goroutine.
type asyncFake struct {
	countingChecker
	jobs chan asyncJob
}

type asyncJob struct {
	req *wire.RateRequest
	out *admission.CheckResult
	t   *ticket
}

func startAsyncFake(t *testing.T, fn func(context.Context, *wire.RateRequest, *admission.CheckResult)) *asyncFake {
	f := &asyncFake{countingChecker: countingChecker{fn: fn}, jobs: make(chan asyncJob, 1)}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for j := range f.jobs {
			f.fn(context.Background(), j.req, j.out)
			j.t.st.checked()
		}
	}()
	t.Cleanup(func() { close(f.jobs); <-done })
	return f
}

func (f *asyncFake) checkAsync(req *wire.RateRequest, out *admission.CheckResult, t *ticket) bool {
	f.jobs <- asyncJob{req, out, t}
	return false
}

func (f *asyncFake) abortCheck(*ticket) {}
