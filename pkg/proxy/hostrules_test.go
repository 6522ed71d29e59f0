package proxy

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/rl-tproxy/rl-tproxy/pkg/exchange"
)

// headEchoUpstream answers every request with its head and body as the
// upstream received them (body after a "|" line).
func headEchoUpstream(t *testing.T) *rawUpstream {
	return newRawUpstream(t, func(_ int, c net.Conn) {
		br := bufio.NewReader(c)
		for {
			head, err := readRequestHead(br)
			if err != nil {
				return
			}
			var body []byte
			if cl := headerOf(head, "Content-Length"); cl != "" {
				n, _ := strconv.Atoi(cl)
				body = make([]byte, n)
				if _, err := io.ReadFull(br, body); err != nil {
					return
				}
			}
			out := head + "|" + string(body)
			fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s", len(out), out)
		}
	})
}

// hostRecorder is a Hook that records the host admission matched on.
type hostRecorder struct {
	mu    sync.Mutex
	hosts []string
}

func (h *hostRecorder) Admit(_ context.Context, r *exchange.Request) exchange.Decision {
	h.mu.Lock()
	h.hosts = append(h.hosts, string(r.Head.Host))
	h.mu.Unlock()
	return exchange.Decision{Allow: true}
}

func (h *hostRecorder) Done(*exchange.Request, *exchange.Decision, *exchange.Result) {}

func (h *hostRecorder) last() string {
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.hosts) == 0 {
		return ""
	}
	return h.hosts[len(h.hosts)-1]
}

// fieldValues returns every value of the named field in head.
func fieldValues(head, name string) []string {
	var vs []string
	for _, l := range strings.Split(head, "\r\n") {
		if k, v, ok := strings.Cut(l, ":"); ok && strings.EqualFold(k, name) {
			vs = append(vs, strings.TrimSpace(v))
		}
	}
	return vs
}

// Connection cannot remove the fields that route or frame a request, and
// an absolute-form target's authority is the one Host that admission and
// the upstream both see (RFC 9112 3.2.2), the target going upstream in
// origin form.
func TestHostAndFramingFieldsSurviveConnection(t *testing.T) {
	up := headEchoUpstream(t)
	hook := &hostRecorder{}
	_, addr := startProxy(t, hook, &exchange.Service{Upstream: up.addr()}, nil)
	for _, tc := range []struct {
		name, req            string
		line, host, body     string
		admitted, wantAbsent string
	}{
		{name: "connection-host",
			req:  "GET /a HTTP/1.1\r\nHost: api.example\r\nConnection: host\r\n\r\n",
			line: "GET /a HTTP/1.1", host: "api.example", admitted: "api.example"},
		{name: "connection-content-length",
			req:  "POST /a HTTP/1.1\r\nHost: api.example\r\nConnection: content-length, keep-alive\r\nContent-Length: 5\r\n\r\nhello",
			line: "POST /a HTTP/1.1", host: "api.example", body: "hello", admitted: "api.example"},
		{name: "connection-names-all",
			req:  "POST /a HTTP/1.1\r\nHost: api.example\r\nConnection: Host, Content-Length, Transfer-Encoding, x-drop\r\nX-Drop: 1\r\nContent-Length: 2\r\n\r\nhi",
			line: "POST /a HTTP/1.1", host: "api.example", body: "hi", admitted: "api.example", wantAbsent: "X-Drop"},
		{name: "absolute-form-conflicting-host",
			req:  "GET http://unprotected.example/api/x?q=1 HTTP/1.1\r\nHost: api.example\r\n\r\n",
			line: "GET /api/x?q=1 HTTP/1.1", host: "unprotected.example", admitted: "unprotected.example"},
		{name: "absolute-form-port-empty-path",
			req:  "GET http://Other.example:8080 HTTP/1.1\r\nHost: api.example\r\n\r\n",
			line: "GET / HTTP/1.1", host: "Other.example:8080", admitted: "Other.example:8080"},
		{name: "absolute-form-options",
			req:  "OPTIONS http://o.example HTTP/1.1\r\nHost: o.example\r\n\r\n",
			line: "OPTIONS * HTTP/1.1", host: "o.example", admitted: "o.example"},
		{name: "http10-without-host",
			req:  "GET /a HTTP/1.0\r\n\r\n",
			line: "GET /a HTTP/1.1", host: up.addr(), admitted: ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := dialClient(t, addr)
			c.send(tc.req)
			method, _, _ := strings.Cut(tc.req, " ")
			r, echoed := c.resp(method)
			if r.StatusCode != 200 {
				t.Fatalf("status %d", r.StatusCode)
			}
			head, body, _ := strings.Cut(echoed, "|")
			if line, _, _ := strings.Cut(head, "\r\n"); line != tc.line {
				t.Errorf("upstream request line %q, want %q", line, tc.line)
			}
			if hosts := fieldValues(head, "Host"); len(hosts) != 1 || hosts[0] != tc.host {
				t.Errorf("upstream Host fields %q, want exactly [%q]", hosts, tc.host)
			}
			if got := hook.last(); got != tc.admitted {
				t.Errorf("admission saw host %q, want %q", got, tc.admitted)
			}
			if body != tc.body {
				t.Errorf("upstream body %q, want %q", body, tc.body)
			}
			if tc.wantAbsent != "" && len(fieldValues(head, tc.wantAbsent)) != 0 {
				t.Errorf("%s named in Connection was forwarded: %q", tc.wantAbsent, head)
			}
			if tc.body != "" && len(fieldValues(head, "Content-Length")) != 1 {
				t.Errorf("upstream framing: %q", head)
			}
		})
	}
}
