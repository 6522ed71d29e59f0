package hook

import (
	"fmt"
	"net"
	"net/http"
	"strings"
	"testing"
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
