package passthrough

import (
	"bufio"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/rl-tproxy/rl-tproxy/pkg/exchange"
)

// TestLenientRequestLineNotRelayed: request lines that a lenient server
// (Python's http.server) parses but the strict parser does not (leading
// whitespace, HTAB or other separators than SP) are answered 400 by the
// proxy on an opaque-passthrough port; they never reach the upstream
// unadmitted through the relay.
func TestLenientRequestLineNotRelayed(t *testing.T) {
	up, got := rawUpstream(t)
	hook := &sniHook{}
	addr, _ := start(t, hook, &exchange.Service{Upstream: up, Opaque: exchange.ModePassthrough})
	for _, in := range []string{
		" GET /admin HTTP/1.1\r\nHost: a\r\n\r\n",
		"\tGET /admin HTTP/1.1\r\nHost: a\r\n\r\n",
		"GET\t/admin\tHTTP/1.1\r\nHost: a\r\n\r\n",
		"GET\v/admin\fHTTP/1.1\r\nHost: a\r\n\r\n",
		"GET\x1f/admin\xa0HTTP/1.1\r\nHost: a\r\n\r\n",
		"get\t/admin\r\n\r\n",
	} {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		c.SetDeadline(time.Now().Add(20 * time.Second))
		if _, err := c.Write([]byte(in)); err != nil {
			t.Fatal(err)
		}
		line, err := bufio.NewReader(c).ReadString('\n')
		c.Close()
		if !strings.HasPrefix(line, "HTTP/1.1 400 ") {
			t.Fatalf("%q: got %q %v, want the parser's 400", in, line, err)
		}
	}
	select {
	case b := <-got:
		t.Fatalf("the upstream got %q", b)
	default:
	}
	hook.mu.Lock()
	defer hook.mu.Unlock()
	if len(hook.seen) != 0 {
		t.Fatalf("hook admitted %q", hook.seen)
	}
}
