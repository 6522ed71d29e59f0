package steer

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/rl-tproxy/rl-tproxy/internal/testkit"
)

// loadWorkers is the number of concurrent client connections of the load
// loop; each has at most one connection in flight, so at most this many
// can be reset when a proxy is killed.
const loadWorkers = 4

// load is a bounded Go client loop in the client namespace: each worker
// opens a connection to nginx's address, sends one GET with Connection:
// close, reads the answer, and classifies the outcome.
type load struct {
	stop     atomic.Bool
	wg       sync.WaitGroup
	viaProxy atomic.Int64 // 200 with the proxy's forwarded headers
	direct   atomic.Int64 // 200 from nginx without them
	refused  atomic.Int64 // ECONNREFUSED on connect
	reset    atomic.Int64 // connection reset / closed before an answer
	// lateReset counts resets of connections dialled after the killed
	// proxy was reaped (afterKill set): there must be none.
	lateReset atomic.Int64
	afterKill atomic.Bool
	other     atomic.Int64 // anything else (unexpected answer, timeout)

	mu      sync.Mutex
	logf    func(format string, args ...any)
	phase   string   // what the test is doing now
	samples []string // first few resets and other failures, for the report
	byPhase map[string]int64
}

// setPhase labels the failures noted from now on.
func (l *load) setPhase(p string) {
	l.logf("%s phase %q begins; load so far: via proxy %d, direct %d", time.Now().Format("15:04:05.000"), p, l.viaProxy.Load(), l.direct.Load())
	l.mu.Lock()
	l.phase = p
	l.mu.Unlock()
}

// maxPerWorker bounds the loop even if the test forgets to stop it.
const maxPerWorker = 50000

func (e *env) startLoad(t *testing.T) *load {
	l := &load{phase: "start", byPhase: map[string]int64{}, logf: t.Logf}
	addr := netip.AddrPortFrom(e.nodeIP, 80).String()
	want := fmt.Sprintf("nginx xff=%s xrealip=%s\n", e.clientIP, e.clientIP)
	for range loadWorkers {
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			err := e.pair.Client.Do(func() error {
				deadline := time.Now().Add(5 * waitBound)
				for n := 0; n < maxPerWorker && !l.stop.Load() && time.Now().Before(deadline); n++ {
					l.one(addr, want)
				}
				return nil
			})
			if err != nil {
				l.note("worker: " + err.Error())
				l.other.Add(1)
			}
		}()
	}
	t.Cleanup(l.halt)
	return l
}

func (l *load) halt() {
	l.stop.Store(true)
	l.wg.Wait()
}

func (l *load) note(s string) {
	l.mu.Lock()
	l.byPhase[l.phase]++
	if len(l.samples) < 20 {
		l.samples = append(l.samples, fmt.Sprintf("[%s %s] %s", l.phase, time.Now().Format("15:04:05.000"), s))
	}
	l.mu.Unlock()
}

// one makes one request (the calling thread is in the client namespace).
func (l *load) one(addr, want string) {
	late := l.afterKill.Load()
	reset := func() {
		l.reset.Add(1)
		if late {
			l.lateReset.Add(1)
		}
	}
	c, err := net.DialTimeout("tcp", addr, 20*time.Second)
	if err != nil {
		switch {
		case errors.Is(err, syscall.ECONNREFUSED):
			l.refused.Add(1)
		case errors.Is(err, syscall.ECONNRESET):
			reset() // the handshake reached a listener that closed
		default:
			l.other.Add(1)
		}
		l.note("dial: " + err.Error())
		return
	}
	r, err := roundTrip(c, addr, "/open/load", true)
	switch {
	case err != nil:
		if errors.Is(err, syscall.ECONNRESET) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.EPIPE) {
			reset()
		} else {
			l.other.Add(1)
		}
		l.note("request: " + err.Error())
	case r.status == 200 && r.body == want:
		l.viaProxy.Add(1)
	case r.status == 200 && r.body == "nginx xff= xrealip=\n":
		l.direct.Add(1)
	default:
		l.other.Add(1)
		l.note(fmt.Sprintf("answer %d %q", r.status, r.body))
	}
}

func (l *load) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return fmt.Sprintf("via proxy %d, direct %d, refused %d, reset %d, other %d; failures by phase %v; samples %q",
		l.viaProxy.Load(), l.direct.Load(), l.refused.Load(), l.reset.Load(), l.other.Load(), l.byPhase, l.samples)
}

// waitMore waits until counter grew by n from its value now.
func (l *load) waitMore(t *testing.T, what string, c *atomic.Int64, n int64) {
	t.Helper()
	base := c.Load()
	testkit.WaitWithin(t, waitBound, fmt.Sprintf("%d more %s answers (load: %s)", n, what, l), func() bool { return c.Load() >= base+n })
}

// countPath counts a proxy's access records for path. It scans only the
// lines logged since the last call (the load logs tens of thousands).
func (p *proxy) countPath(path string) int {
	p.cmu.Lock()
	defer p.cmu.Unlock()
	if p.counts == nil {
		p.counts = map[string]int{}
	}
	p.mu.Lock()
	lines := p.lines[p.scanned:]
	p.scanned = len(p.lines)
	p.mu.Unlock()
	// Substring matching: decoding every JSON line is too slow under -race.
	for _, l := range lines {
		if !strings.Contains(l, `"msg":"access"`) {
			continue
		}
		if i := strings.Index(l, `"path":"`); i >= 0 {
			rest := l[i+len(`"path":"`):]
			if j := strings.IndexByte(rest, '"'); j >= 0 {
				p.counts[rest[:j]]++
			}
		}
	}
	return p.counts[path]
}

// TestKillRestartTakeover: under a client load loop, kill -9 the proxy
// (nginx answers directly, nothing refused), start it again (steering
// resumes from the pins, nothing refused), then start a second proxy while
// that one runs (takeover, nothing refused; the old one must drain and
// exit), and finally SIGTERM the last one (graceful: nginx answers
// directly, nothing refused or reset). Only connections in flight at the
// kill may be reset.
func TestKillRestartTakeover(t *testing.T) { testKillRestartTakeover(t, false) }

// TestKillRestartTakeoverIPv6 is the same over IPv6 (client fd00:200::2 to
// nginx's [fd00:200::1]:80, the proxy's upstream [::1]:80).
func TestKillRestartTakeoverIPv6(t *testing.T) { testKillRestartTakeover(t, true) }

func testKillRestartTakeover(t *testing.T, v6 bool) {
	e := newEnv(t, v6)
	first := e.startProxy("proxy-1")
	l := e.startLoad(t)
	l.waitMore(t, "proxied", &l.viaProxy, 50)

	// 1. kill -9: connections fall through to nginx.
	noSocket := e.counters()["no_socket"]
	// wrk adds its own load over the kill and the restart (one
	// connection per request): its connect errors count refusals.
	type wrkOut struct {
		w   wrkResult
		err error
	}
	wrkDone := make(chan wrkOut, 1)
	go func() {
		w, err := e.runWrk(e.pair.Client.Name, e.url("/open/wrk"), 2, "6s", true)
		wrkDone <- wrkOut{w, err}
	}()
	l.setPhase("kill -9")
	first.kill9(t)
	// Every socket of the killed proxy is closed once it was reaped.
	l.afterKill.Store(true)
	l.waitMore(t, "direct", &l.direct, 100)
	if c := e.counters(); c["no_socket"] <= noSocket {
		t.Fatalf("redirect counters after kill -9: %v; want no_socket to grow (the program stays attached from the pins and passes connections to nginx)", c)
	}
	resetsAtKill := l.reset.Load()
	l.setPhase("restart")

	// 2. Restart: the new proxy reuses the pins and steering resumes.
	second := e.startProxy("proxy-2")
	l.waitMore(t, "proxied", &l.viaProxy, 100)
	if n := second.countPath("/open/load"); n == 0 {
		t.Fatal("restarted proxy logged no load requests")
	}
	wo := <-wrkDone // bounded by its -d and runWrk's deadline
	if wo.err != nil {
		t.Fatal(wo.err)
	}
	t.Logf("wrk over the kill -9 and the restart: %+v", wo.w)
	if wo.w.connectErrs != 0 || wo.w.nonSuccess != 0 || wo.w.other != 0 || wo.w.requests == 0 {
		t.Errorf("wrk over the kill -9 and the restart: %+v; want no connect errors (refusals) and only 200 answers", wo.w)
	}

	// 3. Takeover: a third proxy starts while the second runs.
	l.setPhase("takeover")
	third := e.startProxy("proxy-3")
	testkit.WaitWithin(t, waitBound, "the new proxy to serve the load", func() bool { return third.countPath("/open/load") >= 100 })
	// (An error is fine: the old proxy may already be gone.)
	if r, err := httpGet(e.pair.Node, second.admin, "/readyz", true); err == nil && r.status == 200 {
		t.Errorf("taken-over proxy's /readyz: %d %q; want not ready (its listener left the sockmap)", r.status, r.body)
	}
	beforeExit := second.countPath("/open/load")
	l.setPhase("old proxy exit")
	const exitBound = 30 * time.Second
	if second.waitExit(exitBound) {
		if err := second.waitErr(); err != nil {
			t.Errorf("taken-over proxy exited with %v, want 0\n%s", err, second.tail(20))
		}
		if countLines(second.snapshot(), `"msg":"stopped"`) != 1 {
			t.Errorf("taken-over proxy exited without its \"stopped\" line:\n%s", second.tail(20))
		}
	} else {
		t.Errorf("taken-over proxy still running %v after the takeover: it must notice its listener left the sockmap, drain and exit", exitBound)
		// Stop it the way an operator would; the new proxy must keep
		// steering (the old one only removes slots that still hold its
		// own socket).
		if err := second.cmd.Process.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		if !second.waitExit(waitBound) {
			t.Fatalf("taken-over proxy did not exit on SIGTERM\n%s", second.tail(20))
		}
		if err := second.waitErr(); err != nil {
			t.Errorf("taken-over proxy's SIGTERM exit: %v, want 0", err)
		}
	}
	l.setPhase("after")
	after := third.countPath("/open/load")
	l.waitMore(t, "proxied", &l.viaProxy, 100)
	if third.countPath("/open/load") <= after {
		t.Fatal("the new proxy stopped serving once the old one left")
	}

	// 4. SIGTERM the remaining proxy under load: it leaves the sockmap,
	// drains, exits 0, and nginx answers directly; nothing is refused or
	// reset.
	l.setPhase("sigterm")
	if err := third.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if !third.waitExit(waitBound) {
		t.Fatalf("proxy did not exit on SIGTERM\n%s", third.tail(20))
	}
	if err := third.waitErr(); err != nil {
		t.Errorf("SIGTERM exit: %v, want 0", err)
	}
	l.waitMore(t, "direct", &l.direct, 100)
	l.halt()
	t.Logf("load: %s; connections reset by the kill -9 (in flight while the process was torn down): %d; old proxy served %d load requests before it exited, new proxy %d", l, resetsAtKill, beforeExit, third.countPath("/open/load"))
	if n := l.refused.Load(); n != 0 {
		t.Errorf("%d refused connections (want 0): %s", n, l)
	}
	if n := l.other.Load(); n != 0 {
		t.Errorf("%d failed requests other than resets: %s", n, l)
	}
	// A connection in flight while the killed process was torn down may
	// be reset (accepted by it, or handshaken on its closing listener);
	// none dialled after it was reaped, and none outside the kill.
	if n := l.lateReset.Load(); n != 0 || l.reset.Load() != resetsAtKill {
		t.Errorf("%d connections reset outside the kill -9 (dialled after the killed proxy was reaped; failures by phase above): "+
			"a restart, takeover or graceful stop must not reset connections (%d resets in all, %d in flight at the kill): %s", n, l.reset.Load(), resetsAtKill, l)
	}
	if _, err := os.Stat(e.nginxLog); err != nil {
		t.Fatal(err)
	}
	lines := e.nginxLines()
	if n := countLines(lines, "uri=/open/load ", `xff="`+e.clientIP.String()+`"`); int64(n) < l.viaProxy.Load() {
		t.Errorf("nginx logged %d proxied load requests, the client got %d proxied answers", n, l.viaProxy.Load())
	}
	if n := countLines(lines, "uri=/open/load ", `xff="-"`, "peer="+e.clientIP.String()+" "); int64(n) < l.direct.Load() {
		t.Errorf("nginx logged %d direct load requests, the client got %d direct answers", n, l.direct.Load())
	}
	if s := strings.Join(l.samples, "; "); s != "" {
		t.Logf("failure samples: %s", s)
	}
}
