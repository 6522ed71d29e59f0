package proxy

import (
	"io"
	"net/http"
	"testing"

	"github.com/rl-tproxy/rl-tproxy/pkg/exchange"
)

// The HTTP/1.1 loop applies exchange.CheckPath before admission: 400 and no
// Admit for a refused path, admission otherwise.
func TestEscapedSlashThroughLoop(t *testing.T) {
	up := httpUpstream(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") }))
	for _, tc := range []struct {
		decode bool
		path   string
		status int
	}{
		{false, "/api%2fx", 400},
		{false, "/api%5cx", 400},
		{false, "/api/x", 200},
		{true, "/api%2fx", 200},
		{true, "/api%2F..%2Fx", 400},
	} {
		hook := newTestHook(nil)
		_, addr := startProxy(t, hook, &exchange.Service{Upstream: up, DecodeEscapedSlashes: tc.decode}, nil)
		c := dialClient(t, addr)
		c.send("GET " + tc.path + " HTTP/1.1\r\nHost: x\r\n\r\n")
		if r, _ := c.resp("GET"); r.StatusCode != tc.status {
			t.Errorf("decode=%v %s: status %d, want %d", tc.decode, tc.path, r.StatusCode, tc.status)
		}
		if admitted := len(hook.admitted()) == 1; admitted != (tc.status == 200) {
			t.Errorf("decode=%v %s: admitted %v", tc.decode, tc.path, admitted)
		}
	}
}
