package proxy

import (
	"bufio"
	"io"
	"net"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/rl-tproxy/rl-tproxy/pkg/exchange"
)

// TestSplitResponseKeepsUpstreamPooled: a response whose chunk line is
// split across two upstream reads (the proxy holds the partial line) ends
// cleanly, so the upstream connection is pooled and the next request
// reuses it; nothing counts as discarded.
func TestSplitResponseKeepsUpstreamPooled(t *testing.T) {
	headSeen := make(chan struct{}, 2)
	var requests atomic.Int32
	up := newRawUpstream(t, func(_ int, c net.Conn) {
		br := bufio.NewReader(c)
		for {
			if _, err := readRequestHead(br); err != nil {
				return
			}
			if requests.Add(1) == 1 {
				// First part: the head and a chunk-size line without its CRLF.
				if _, err := io.WriteString(c, "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5"); err != nil {
					return
				}
				<-headSeen // the client got the head: the proxy read the first part
				if _, err := io.WriteString(c, "\r\nhello\r\n0\r\n\r\n"); err != nil {
					return
				}
				continue
			}
			if _, err := io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"); err != nil {
				return
			}
		}
	})
	p, addr := startProxy(t, nil, &exchange.Service{Upstream: up.addr()}, nil)
	cl := dialClient(t, addr)
	cl.send("GET /a HTTP/1.1\r\nHost: x\r\n\r\n")
	line, err := cl.br.ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "HTTP/1.1 200") {
		t.Fatalf("status line %q, %v", line, err)
	}
	headSeen <- struct{}{}
	for {
		l, err := cl.br.ReadString('\n')
		if err != nil {
			t.Fatalf("reading the first response: %v", err)
		}
		if l == "0\r\n" {
			if _, err := cl.br.ReadString('\n'); err != nil { // the final CRLF
				t.Fatal(err)
			}
			break
		}
	}
	cl.send("GET /b HTTP/1.1\r\nHost: x\r\n\r\n")
	if _, body := cl.resp("GET"); body != "ok" {
		t.Fatalf("second body %q, want ok", body)
	}
	if n := up.count(); n != 1 {
		t.Errorf("upstream saw %d connections, want 1 (the split response's connection reused)", n)
	}
	if d := p.Stats().UpstreamDiscarded; d != 0 {
		t.Errorf("UpstreamDiscarded = %d, want 0", d)
	}
}
