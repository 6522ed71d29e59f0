package proxy

import (
	"context"
	"strings"
	"testing"

	"github.com/rl-tproxy/rl-tproxy/internal/testkit"
	"github.com/rl-tproxy/rl-tproxy/pkg/exchange"
	"github.com/rl-tproxy/rl-tproxy/pkg/httpparse"
)

// resultHook admits with fixed forward fields and hands each Result (and
// the Request's protocol) to a channel.
type resultHook struct {
	forward []httpparse.Header
	results chan resultRec
}

type resultRec struct {
	proto string
	res   exchange.Result
}

func (h *resultHook) Admit(context.Context, *exchange.Request) exchange.Decision {
	return exchange.Decision{Allow: true, Forward: h.forward}
}

func (h *resultHook) Done(r *exchange.Request, _ *exchange.Decision, res *exchange.Result) {
	h.results <- resultRec{proto: r.Proto, res: *res}
}

// Decision.Forward adds fields to the upstream request and replaces a
// client field of the same name (any case); other client fields, such as
// traceparent, pass untouched. Result carries the upstream address, its
// status and time to the response head, and the client's protocol.
func TestForwardFieldsAndUpstreamResult(t *testing.T) {
	heads := make(chan string, 4)
	up := headUpstream(t, heads, func(string) string { return "HTTP/1.1 201 Created\r\nContent-Length: 2\r\n\r\nok" })
	svc := &exchange.Service{Name: "web", Upstream: up.addr()}
	hook := &resultHook{forward: []httpparse.Header{{Name: []byte("X-Request-ID"), Value: []byte("gen-1")}},
		results: make(chan resultRec, 4)}
	_, addr := startProxy(t, hook, svc, nil)
	const tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	for _, c := range []struct {
		name, req, proto string
	}{
		{"replaced", "GET /a HTTP/1.1\r\nHost: x\r\nx-request-id: bad id\r\ntraceparent: " + tp + "\r\n\r\n", exchange.ProtoHTTP11},
		{"added", "GET /b HTTP/1.0\r\nHost: x\r\ntraceparent: " + tp + "\r\n\r\n", exchange.ProtoHTTP10},
	} {
		t.Run(c.name, func(t *testing.T) {
			cl := dialClient(t, addr)
			cl.send(c.req)
			r, body := cl.resp("GET")
			if r.StatusCode != 201 || body != "ok" {
				t.Fatalf("answer %d %q", r.StatusCode, body)
			}
			head := <-heads
			if n := strings.Count(strings.ToLower(head), "x-request-id:"); n != 1 || headerOf(head, "X-Request-ID") != "gen-1" {
				t.Errorf("upstream head has %d request ids, want only gen-1:\n%s", n, head)
			}
			if got := headerOf(head, "traceparent"); got != tp {
				t.Errorf("traceparent %q, want %q", got, tp)
			}
			rec := <-hook.results
			if rec.proto != c.proto {
				t.Errorf("proto %q, want %q", rec.proto, c.proto)
			}
			res := rec.res
			if res.Upstream != up.addr() || res.UpstreamStatus != 201 || res.UpstreamTTFB <= 0 || res.Status != 201 {
				t.Errorf("result upstream %q status %d ttfb %v (client status %d)", res.Upstream, res.UpstreamStatus, res.UpstreamTTFB, res.Status)
			}
		})
	}
}

// A request that never reaches an upstream has no upstream status, and a
// dead upstream leaves the address but no status.
func TestUpstreamResultWithoutResponse(t *testing.T) {
	dead := testkit.RefusedAddr(t)
	hook := &resultHook{results: make(chan resultRec, 4)}
	_, addr := startProxy(t, hook, &exchange.Service{Name: "web", Upstream: dead}, nil)
	cl := dialClient(t, addr)
	cl.send("GET /a HTTP/1.1\r\nHost: x\r\n\r\n")
	if r, _ := cl.resp("GET"); r.StatusCode != 502 {
		t.Fatalf("status %d, want 502", r.StatusCode)
	}
	res := (<-hook.results).res
	if res.Upstream != dead || res.UpstreamStatus != 0 || res.UpstreamTTFB != 0 || res.UpstreamErr == nil {
		t.Errorf("result upstream %q status %d ttfb %v err %v", res.Upstream, res.UpstreamStatus, res.UpstreamTTFB, res.UpstreamErr)
	}
}
