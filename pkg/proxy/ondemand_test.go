package proxy

import (
	"context"
	"io"
	"net/http"
	"testing"
)

// onDemandHook is a testHook that is an OnDemandWatcher: the proxy
// watches its clients only when Admit calls WatchClient or a Decision
// sets WatchClient.
type onDemandHook struct{ *testHook }

func (onDemandHook) WatchesOnDemand() {}

// A watch is started only where the Hook asks for one; a Hook that is no
// OnDemandWatcher has every request watched. Counted with
// Stats.WatchStarts over a bodyless GET (watched, if at all, from
// admission through the response) and a chunked POST (its body is read
// after admission, so admission and response are watched separately).
func TestOnDemandWatchOnlyWhenAsked(t *testing.T) {
	goroutinePathOnly(t)
	allow := func(watch, inAdmit bool) func(context.Context, *Request) Decision {
		return func(ctx context.Context, _ *Request) Decision {
			if inAdmit {
				WatchClient(ctx)
			}
			return Decision{Allow: true, WatchClient: watch}
		}
	}
	for _, tc := range []struct {
		name string
		hook Hook
		want uint64
	}{
		{"on-demand-unwatched", onDemandHook{newTestHook(allow(false, false))}, 0},
		{"on-demand-decision-asks", onDemandHook{newTestHook(allow(true, false))}, 1 + 1},
		{"on-demand-admit-and-decision-ask", onDemandHook{newTestHook(allow(true, true))}, 1 + 2},
		{"on-demand-admit-asks-only", onDemandHook{newTestHook(allow(false, true))}, 1 + 1},
		{"every-request", newTestHook(nil), 1 + 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			up := httpUpstream(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				io.Copy(io.Discard, r.Body)
				io.WriteString(w, "ok")
			}))
			p, addr := startProxy(t, tc.hook, &Service{Upstream: up}, nil)
			c := dialClient(t, addr)
			c.send("GET /a HTTP/1.1\r\nHost: x\r\n\r\n")
			if r, body := c.resp("GET"); r.StatusCode != 200 || body != "ok" {
				t.Fatalf("GET: %d %q", r.StatusCode, body)
			}
			c.send("POST /b HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n")
			if r, body := c.resp("POST"); r.StatusCode != 200 || body != "ok" {
				t.Fatalf("POST: %d %q", r.StatusCode, body)
			}
			if got := p.Stats().WatchStarts; got != tc.want {
				t.Fatalf("watch starts %d, want %d", got, tc.want)
			}
		})
	}
}

// An OnDemandWatcher's Admit that calls WatchClient before it waits is
// cancelled when the client goes away, as with any Hook.
func TestOnDemandAdmitWatchCancels(t *testing.T) {
	entered := make(chan struct{})
	hook := onDemandHook{newTestHook(func(ctx context.Context, _ *Request) Decision {
		WatchClient(ctx)
		close(entered)
		<-ctx.Done()
		return Decision{Status: 503}
	})}
	up := httpUpstream(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	p, addr := startProxy(t, hook, &Service{Upstream: up}, nil)
	c := dialClient(t, addr)
	c.send("GET /a HTTP/1.1\r\nHost: x\r\n\r\n")
	<-entered
	c.c.Close()
	if d := hook.waitDone(t); !d.clientAborted || d.status != 0 {
		t.Fatalf("done %+v", d)
	}
	// The event loops watch every client without watchers.
	if got := p.Stats().WatchStarts; got != 1 && defaultEventLoops == 0 {
		t.Fatalf("watch starts %d, want 1", got)
	}
}

// A Decision that sets WatchClient has the response phase watched: a
// client that resets while the upstream works cancels the exchange.
func TestOnDemandDecisionWatchCancelsExchange(t *testing.T) {
	up, gotHead, upClosed, _ := slowUpstream(t, "")
	hook := onDemandHook{newTestHook(func(context.Context, *Request) Decision {
		return Decision{Allow: true, WatchClient: true}
	})}
	_, addr := startProxy(t, hook, &Service{Upstream: up.addr()}, nil)
	c := dialClient(t, addr)
	c.send("GET /slow HTTP/1.1\r\nHost: x\r\n\r\n")
	<-gotHead
	resetClose(t, c.c)
	waitUpstreamClosed(t, upClosed)
	if d := hook.waitDone(t); !d.clientAborted || d.status != 0 || d.upstreamErr != nil {
		t.Fatalf("done %+v", d)
	}
}
