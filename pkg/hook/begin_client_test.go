package hook

import (
	"context"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rl-tproxy/rl-tproxy/internal/dnstest"
	"github.com/rl-tproxy/rl-tproxy/internal/testkit"
	"github.com/rl-tproxy/rl-tproxy/internal/testkit/rlcluster"
	"github.com/rl-tproxy/rl-tproxy/pkg/exchange"
	"github.com/rl-tproxy/rl-tproxy/pkg/ratelimitly"
	"github.com/rl-tproxy/rl-tproxy/pkg/rlclient"
)

// countResumer counts Resume calls and signals each.
type countResumer struct {
	mu sync.Mutex
	n  int
	ch chan struct{}
}

func newCountResumer() *countResumer { return &countResumer{ch: make(chan struct{}, 16)} }

func (c *countResumer) Resume() {
	c.mu.Lock()
	c.n++
	c.mu.Unlock()
	c.ch <- struct{}{}
}

func (c *countResumer) count() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n
}

func (c *countResumer) wait(t *testing.T) {
	t.Helper()
	select {
	case <-c.ch:
	case <-time.After(20 * time.Second):
		t.Fatal("no Resume")
	}
}

// silentGate is a quiet Gate (policy testPolicyYAML with fail) whose
// checker is an rlclient Client of one endpoint that never answers, and
// a request for its protected location /api/x.
func silentGate(t *testing.T, fail string, unit time.Duration) (*Gate, *exchange.Request, *rlclient.Client) {
	t.Helper()
	pc, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pc.Close() })
	d := dnstest.Start(t)
	const srv = "_ratelimitly._udp.rl.test"
	d.SetSRV(srv, rlcluster.Targets("rl.test", pc.LocalAddr().(*net.UDPAddr).AddrPort())...)
	cl, err := rlclient.New(rlclient.Config{SRV: srv, Resolver: d.Addr(), Credential: rlcluster.NewCredential(t, "t", 1),
		Policy: ratelimitly.Standard(unit), Bind: netip.MustParseAddr("127.0.0.1"), Shards: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cl.Close() })
	testkit.WaitFor(t, "discovery", cl.Ready)
	g, r := quietGate(t, fail, allowAll)
	g.SetChecker(NewClient(cl), nil)
	return g, r, cl
}

// An admission through Begin against an embedded RateLimitly: pending,
// resumed once with the same decisions Admit takes (allow, then deny once
// the zone's burst is spent), and every Done accounted.
func TestBeginEmbeddedAllowThenDeny(t *testing.T) {
	g, r := embeddedGate(t, "1/m")
	res := &exchange.Result{Status: 200}
	var statuses []int
	for i := 0; i < 3; i++ {
		w := newCountResumer()
		var d exchange.Decision
		r.Start = time.Now()
		if g.Begin(r, &d, w) {
			t.Fatalf("request %d decided without its check", i)
		}
		w.wait(t)
		if d.State == nil {
			t.Fatalf("request %d: Decision not filled before Resume", i)
		}
		statuses = append(statuses, d.Status)
		if d.Allow {
			statuses[i] = 200
		}
		res.End = time.Now()
		g.Done(r, &d, res)
		if n := w.count(); n != 1 {
			t.Fatalf("request %d resumed %d times", i, n)
		}
	}
	// Rate 1/m: the default burst admits the first request only.
	if statuses[0] != 200 || statuses[1] != 429 || statuses[2] != 429 {
		t.Fatalf("statuses %v, want 200 then 429s", statuses)
	}
	if n := testutilCount(t, g, "rl_tproxy_requests_total"); n != 3 {
		t.Errorf("%v requests counted, want 3", n)
	}
}

// Cancel while the check waits for a silent RateLimitly: the rlclient
// check is aborted at once and the proxy resumed (from inside Cancel)
// with the client-gone decision; a later Cancel changes nothing.
func TestBeginCancelAbortsCheck(t *testing.T) {
	g, r, cl := silentGate(t, "open", 2*time.Second)
	w := newCountResumer()
	var d exchange.Decision
	if g.Begin(r, &d, w) {
		t.Fatal("decided without its check")
	}
	testkit.WaitFor(t, "check in flight", func() bool { return cl.Stats().InFlight == 1 })
	g.Cancel(r)
	if n := w.count(); n != 1 {
		t.Fatalf("%d Resumes right after Cancel, want 1", n)
	}
	st := d.State.(*state)
	if d.Allow || d.Status != statusClientClosed || st.dec.Cause != ratelimitly.CauseCancelled {
		t.Fatalf("decision allow %v status %d cause %v", d.Allow, d.Status, st.dec.Cause)
	}
	g.Cancel(r)
	g.Done(r, &d, &exchange.Result{ClientAborted: true, End: time.Now()})
	if n := w.count(); n != 1 || cl.Stats().InFlight != 0 {
		t.Fatalf("%d Resumes, %d checks in flight", n, cl.Stats().InFlight)
	}
}

// No answer within the horizon: the failure policy decides, as in Admit.
func TestBeginHorizonFailurePolicy(t *testing.T) {
	for _, c := range []struct {
		fail   string
		allow  bool
		status int
	}{{"open", true, 0}, {"close", false, 429}} {
		t.Run(c.fail, func(t *testing.T) {
			g, r, _ := silentGate(t, c.fail, 5*time.Millisecond)
			w := newCountResumer()
			var d exchange.Decision
			if g.Begin(r, &d, w) {
				t.Fatal("decided without its check")
			}
			w.wait(t)
			st := d.State.(*state)
			if d.Allow != c.allow || d.Status != c.status || st.dec.Cause != ratelimitly.CauseTimeout {
				t.Fatalf("allow %v status %d cause %v", d.Allow, d.Status, st.dec.Cause)
			}
			g.Done(r, &d, &exchange.Result{Status: 200, End: time.Now()})
			if n := w.count(); n != 1 {
				t.Fatalf("resumed %d times", n)
			}
		})
	}
}

// Closing the client with checks in flight resumes each of them exactly
// once, with the decision Admit takes in the same situation.
func TestBeginClientClosedInFlight(t *testing.T) {
	g, _, cl := silentGate(t, "close", 2*time.Second)
	const n = 16
	ws := make([]*countResumer, n)
	ds := make([]exchange.Decision, n)
	rs := make([]exchange.Request, n)
	for i := range n {
		_, r := quietGate(t, "close", allowAll)
		rs[i] = *r
		ws[i] = newCountResumer()
		if g.Begin(&rs[i], &ds[i], ws[i]) {
			t.Fatalf("request %d decided without its check", i)
		}
	}
	_, ar := quietGate(t, "close", allowAll)
	admitted := make(chan exchange.Decision, 1)
	go func() { admitted <- g.Admit(context.Background(), ar) }()
	testkit.WaitFor(t, "checks in flight", func() bool { return cl.Stats().InFlight == n+1 })
	cl.Close()
	ad := <-admitted
	for i := range n {
		if c := ws[i].count(); c != 1 {
			t.Errorf("request %d resumed %d times", i, c)
		}
		if ds[i].Allow != ad.Allow || ds[i].Status != ad.Status {
			t.Errorf("request %d: allow %v status %d; Admit: allow %v status %d", i, ds[i].Allow, ds[i].Status, ad.Allow, ad.Status)
		}
		g.Done(&rs[i], &ds[i], &exchange.Result{End: time.Now()})
	}
	g.Done(ar, &ad, &exchange.Result{End: time.Now()})
}

// testutilCount sums every series of the counter family name.
func testutilCount(t *testing.T, g *Gate, name string) float64 {
	t.Helper()
	fams, err := g.Metrics().Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	sum := 0.0
	for _, f := range fams {
		if f.GetName() == name {
			for _, m := range f.GetMetric() {
				sum += m.GetCounter().GetValue()
			}
		}
	}
	return sum
}

// Cancels racing answers: with an embedded RateLimitly answering at
// once, Cancel comes while the check runs, or after its Resume but before
// the proxy handled it, or not at all.
// Every request is resumed exactly once, with a decision, and its Done
// releases everything (no check in flight, nothing pending).
func TestBeginCancelRacesAnswers(t *testing.T) {
	g, r := embeddedGate(t, "1000000000/s")
	const workers, per = 4, 100
	var wg sync.WaitGroup
	errs := make(chan string, workers*per)
	all := make([][]*countResumer, workers)
	var cancelled atomic.Int64
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rr := *r
			for i := range per {
				res := newCountResumer()
				all[w] = append(all[w], res)
				var d exchange.Decision
				rr.Start = time.Now()
				if !g.Begin(&rr, &d, res) {
					switch (i + w) % 3 {
					case 0: // while the check runs (or as it ends)
						g.Cancel(&rr)
						<-res.ch
					case 1: // resumed, but the loop has not handled it yet
						<-res.ch
						g.Cancel(&rr)
					default:
						<-res.ch
					}
				}
				g.Done(&rr, &d, &exchange.Result{Status: 200, End: time.Now()})
				if d.State == nil {
					errs <- "decision not filled"
				}
				if d.Status == statusClientClosed {
					cancelled.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Error(e)
	}
	for _, rs := range all {
		for _, res := range rs {
			if n := res.count(); n > 1 {
				t.Errorf("resumed %d times", n)
			}
		}
	}
	t.Logf("%d of %d requests ended cancelled", cancelled.Load(), workers*per)
	if n := g.pending.Load(); n != 0 {
		t.Errorf("%d requests still pending", n)
	}
}

// blockingCloser's Close waits until release is closed.
type blockingCloser struct {
	entered, release chan struct{}
}

func (c *blockingCloser) Close() error {
	close(c.entered)
	<-c.release
	return nil
}

// The Done that drops the last reference to a retired checker does not
// wait for its Close (which for an rlclient Client can wait for a DNS
// query): on the loop path Done runs on the loop thread.
func TestDoneDoesNotWaitForCheckerClose(t *testing.T) {
	g, r := quietGate(t, "close", allowAll)
	bc := &blockingCloser{entered: make(chan struct{}), release: make(chan struct{})}
	g.SetChecker(&countingChecker{fn: allowAll}, bc)
	d := admitVia(g, context.Background(), r)
	closed := g.SetChecker(&countingChecker{fn: allowAll}, nil)
	done := make(chan struct{})
	go func() {
		g.Done(r, &d, &exchange.Result{Status: 200, End: time.Now()})
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		t.Fatal("Done waited for the old checker's Close")
	}
	<-bc.entered // closed aside
	close(bc.release)
	<-closed
}
