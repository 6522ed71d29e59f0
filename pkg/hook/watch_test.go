package hook

import (
	"fmt"
	"net"
	"net/http"
	"strings"
	"testing"
)

// The Gate has the proxy watch a client only where an abort changes the
// outcome or a report: a protected location (its check is cancelled, its
// outcome is client_abort) and any location with a report (never sent
// after a client that went away). An unprotected location without a
// report, and a request no location matches, start no watcher.
func TestWatchOnlyWhereAbortMatters(t *testing.T) {
	r := newRig(t, "close", allowAll)
	for _, tc := range []struct {
		path, location, outcome string
		watches                 uint64
	}{
		{"/open/x", "open", "bypass", 0},
		{"/healthz", "health", "bypass", 1}, // unprotected with report: the response
		{"/api/x", "api", "allow", 1},       // the check, then on through the response
		{"/shadow/x", "shadow", "allow", 1},
	} {
		before := r.p.Stats().WatchStarts
		if resp := r.get(t, tc.path, "k-"+tc.location); resp.StatusCode != 200 {
			t.Fatalf("%s: status %d", tc.path, resp.StatusCode)
		}
		if got := r.p.Stats().WatchStarts - before; got != tc.watches {
			t.Errorf("%s (location %s): %d watches started, want %d", tc.path, tc.location, got, tc.watches)
		}
	}
	lines := r.accessLines(t, 4)
	for i, want := range []string{"open", "health", "api", "shadow"} {
		if lines[i]["location"] != want {
			t.Fatalf("access line %d: %v, want location %s", i, lines[i], want)
		}
	}
	if lines[0]["outcome"] != "bypass" {
		t.Fatalf("unprotected access line %v", lines[0])
	}
}

// An unprotected location with a report still notices a client that
// resets while the upstream works: the exchange is cancelled, the outcome
// is client_abort and no report is sent.
func TestClientAbortUnprotectedReportNoReport(t *testing.T) {
	entered := make(chan struct{})
	cancelled := make(chan struct{})
	r := newRigUpstream(t, "close", allowAll, http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		close(entered)
		<-req.Context().Done() // the proxy closed the upstream connection
		close(cancelled)
	}))
	c, err := net.Dial("tcp", strings.TrimPrefix(r.base, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(c, "GET /healthz HTTP/1.1\r\nHost: a\r\n\r\n")
	<-entered
	if err := c.(*net.TCPConn).SetLinger(0); err != nil { // close with a reset
		t.Fatal(err)
	}
	c.Close()
	<-cancelled
	l := r.accessLines(t, 1)[0]
	if l["outcome"] != "client_abort" || l["location"] != "health" {
		t.Fatalf("access line %v, want outcome client_abort at location health", l)
	}
	if r.ck.reports.Load() != 0 {
		t.Fatal("report after client abort")
	}
}
