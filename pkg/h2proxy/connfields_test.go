package h2proxy_test

import (
	"io"
	"net/http"
	"testing"

	"github.com/rl-tproxy/rl-tproxy/pkg/exchange"
	"github.com/rl-tproxy/rl-tproxy/pkg/h2proxy"
)

// TestResponseConnectionFieldsDropped: the fields an HTTP/1.1 upstream's
// response names in Connection are its connection's, not the message's
// (RFC 9110 7.6.1): an HTTP/2 client never sees them; the others pass.
func TestResponseConnectionFieldsDropped(t *testing.T) {
	// A raw answer: net/http would not send these fields as written.
	up := serveHTTP(t, false, &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		c, brw, err := w.(http.Hijacker).Hijack()
		if err != nil {
			return
		}
		defer c.Close()
		_, _ = brw.WriteString("HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: X-Up, keep-alive\r\n" +
			"connection: x-up2\r\nX-Up: secret\r\nX-Up2: secret\r\nKeep-Alive: timeout=5\r\nX-Keep: 1\r\n\r\nok")
		_ = brw.Flush()
	})})
	_, addr := startProxy(t, &exchange.Service{Name: "s", Upstream: up, UpstreamProtocol: h2proxy.ProtoHTTP1}, &rec{})
	cl := h2cClient()
	defer cl.CloseIdleConnections()
	res, err := cl.Get("http://" + addr + "/")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(res.Body)
	_ = res.Body.Close()
	if res.StatusCode != 200 || string(body) != "ok" {
		t.Fatalf("%d %q", res.StatusCode, body)
	}
	for _, gone := range []string{"X-Up", "X-Up2", "Keep-Alive", "Connection"} {
		if v := res.Header.Get(gone); v != "" {
			t.Errorf("%s (named in the upstream's Connection or hop-by-hop) reached the client: %q", gone, v)
		}
	}
	if res.Header.Get("X-Keep") != "1" {
		t.Errorf("X-Keep dropped: %v", res.Header)
	}
}
