package hook

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/rl-tproxy/rl-tproxy/pkg/admission"
	"github.com/rl-tproxy/rl-tproxy/pkg/proxy"
	"github.com/rl-tproxy/rl-tproxy/pkg/ratelimitly"
	"github.com/rl-tproxy/rl-tproxy/pkg/ratelimitly/wire"
)

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

// A check that outlives the proxy's admission bound: the proxy cancels it
// and answers 503 itself; the access line says internal_error (the proxy
// gave up), not client_abort, and nothing is reported.
func TestAdmissionTimeoutIsInternalError(t *testing.T) {
	cancelled := make(chan struct{})
	r := newRigUpstream(t, "open", func(ctx context.Context, _ *wire.RateRequest, out *admission.CheckResult) {
		<-ctx.Done() // never answers on its own
		close(cancelled)
		out.Valid, out.Fail = false, ratelimitly.CauseCancelled
	}, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "upstream") }),
		// The service's own bound wins over the Config's: the policy's
		// timeouts.admission (70s by default) is on the service.
		func(c *proxy.Config) { c.Services[0].AdmissionTimeout = 20 * time.Millisecond })
	resp := r.get(t, "/api/x", "k")
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("status %d, want 503", resp.StatusCode)
	}
	<-cancelled
	l := r.accessLines(t, 1)[0]
	if l["outcome"] != "internal_error" || l["verdict"] != "-" {
		t.Fatalf("access line %v, want outcome internal_error, verdict -", l)
	}
	if r.ck.reports.Load() != 0 {
		t.Fatal("report after the proxy gave up on admission")
	}
}
