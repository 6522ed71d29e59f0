package proxy

import (
	"fmt"
	"strings"
	"testing"

	"github.com/rl-tproxy/rl-tproxy/pkg/exchange"
)

// connOptions lists n Connection options: prefix0, prefix1, ...
func connOptions(prefix string, n int) string {
	var sb strings.Builder
	for i := range n {
		if i > 0 {
			sb.WriteString(", ")
		}
		fmt.Fprintf(&sb, "%s%d", prefix, i)
	}
	return sb.String()
}

// connFields sends a field for each of n options: Prefix0: v ...
func connFields(prefix string, n int) string {
	var sb strings.Builder
	for i := range n {
		fmt.Fprintf(&sb, "%s%d: v\r\n", prefix, i)
	}
	return sb.String()
}

// TestConnectionOptionsDropped: with as many Connection options as the
// parser accepts (httpparse.MaxConnectionOptions, 16), every field they
// name is dropped both ways and the others pass; an upstream response
// listing more is answered 502.
func TestConnectionOptionsDropped(t *testing.T) {
	heads := make(chan string, 2)
	up := headUpstream(t, heads, func(head string) string {
		n := 16
		if strings.HasPrefix(head, "GET /flood ") {
			n = 17
		}
		return "HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: " + connOptions("X-R", n) + "\r\n" +
			connFields("X-R", n) + "X-Keep: 1\r\n\r\n"
	})
	_, addr := startProxy(t, newTestHook(nil), &exchange.Service{Upstream: up.addr()}, nil)
	c := dialClient(t, addr)
	c.send("GET /ok HTTP/1.1\r\nHost: x\r\nConnection: " + connOptions("X-Q", 16) + "\r\n" + connFields("X-Q", 16) + "X-Keep: yes\r\n\r\n")
	r, _ := c.resp("GET")
	head := <-heads
	for i := range 16 {
		if v := headerOf(head, fmt.Sprintf("X-Q%d", i)); v != "" {
			t.Errorf("X-Q%d, named in Connection, forwarded:\n%s", i, head)
		}
		if v := r.Header.Get(fmt.Sprintf("X-R%d", i)); v != "" {
			t.Errorf("X-R%d, named in the response's Connection, forwarded: %v", i, r.Header)
		}
	}
	if headerOf(head, "X-Keep") != "yes" || r.Header.Get("X-Keep") != "1" || r.StatusCode != 200 {
		t.Fatalf("the fields not named were dropped: %d %v\n%s", r.StatusCode, r.Header, head)
	}

	c.send("GET /flood HTTP/1.1\r\nHost: x\r\n\r\n")
	<-heads
	if r, _ := c.resp("GET"); r.StatusCode != 502 {
		t.Fatalf("response with 17 Connection options: client got %d, want 502", r.StatusCode)
	}
}
