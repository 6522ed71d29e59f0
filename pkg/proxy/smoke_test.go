package proxy

import (
	"net/http"
	"testing"
)

func TestSmoke(t *testing.T) {
	up := httpUpstream(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Seen-XFF", r.Header.Get("X-Forwarded-For"))
		w.Write([]byte("hello " + r.URL.Path))
	}))
	hook := newTestHook(nil)
	_, addr := startProxy(t, hook, &Service{Upstream: up, XForwardedFor: true}, nil)
	c := dialClient(t, addr)
	for i := 0; i < 3; i++ {
		c.send("GET /a?x=1 HTTP/1.1\r\nHost: x\r\n\r\n")
		r, body := c.resp("GET")
		if r.StatusCode != 200 || body != "hello /a" || r.Header.Get("X-Seen-XFF") != "127.0.0.1" {
			t.Fatalf("got %d %q %v", r.StatusCode, body, r.Header)
		}
		d := hook.waitDone(t)
		if d.status != 200 || !d.startBeforeEnd {
			t.Fatalf("done %+v", d)
		}
	}
}
