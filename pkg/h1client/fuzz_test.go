package h1client_test

import (
	"context"
	"io"
	"net"
	"net/http"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/rl-tproxy/rl-tproxy/internal/fuzzcorpus"
	"github.com/rl-tproxy/rl-tproxy/pkg/h1client"
	"github.com/rl-tproxy/rl-tproxy/pkg/httpparse"
)

// scriptConn is an upstream connection that answers with fixed bytes,
// step bytes per read, then EOF; what the client writes is dropped.
type scriptConn struct {
	data []byte
	step int
}

func (c *scriptConn) Read(p []byte) (int, error) {
	if len(c.data) == 0 {
		return 0, io.EOF
	}
	n := copy(p[:min(len(p), c.step)], c.data)
	c.data = c.data[n:]
	return n, nil
}

func (c *scriptConn) Write(p []byte) (int, error)      { return len(p), nil }
func (c *scriptConn) Close() error                     { return nil }
func (c *scriptConn) LocalAddr() net.Addr              { return &net.TCPAddr{} }
func (c *scriptConn) RemoteAddr() net.Addr             { return &net.TCPAddr{} }
func (c *scriptConn) SetDeadline(time.Time) error      { return nil }
func (c *scriptConn) SetReadDeadline(time.Time) error  { return nil }
func (c *scriptConn) SetWriteDeadline(time.Time) error { return nil }

// streamOutcome is what a client made of an upstream's bytes.
type streamOutcome struct {
	HeadErr  bool
	Status   int
	Header   http.Header
	Length   int64
	Body     string
	BodyErr  bool
	Trailer  http.Header
	Reusable bool // Response.Close not set
}

// readStream sends method over a connection that answers data step
// bytes at a time and reads the whole response.
func readStream(t *testing.T, method string, data []byte, step int) (streamOutcome, error) {
	p := h1client.New(h1client.Config{Addr: "upstream.test:80", MaxIdle: 1,
		Dial: func(context.Context, string, string) (net.Conn, error) {
			return &scriptConn{data: data, step: step}, nil
		}})
	defer p.CloseIdleConnections()
	req, _ := http.NewRequest(method, "http://upstream.test/", nil)
	res, err := p.RoundTrip(req)
	if err != nil {
		return streamOutcome{HeadErr: true}, err
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	return streamOutcome{Status: res.StatusCode, Header: res.Header, Length: res.ContentLength, Body: string(b),
		BodyErr: err != nil, Trailer: res.Trailer, Reusable: !res.Close}, err
}

// verdict is httpparse's verdict on data's heads, read directly: the
// final head's response and where it ends, or the error.
func verdict(method string, data []byte) (*httpparse.Response, int, error) {
	var r httpparse.Response
	var seen httpparse.Interims
	off := 0
	for {
		err := r.ParseUpstream(data[off:], []byte(method), &seen)
		if err != nil {
			return nil, 0, err
		}
		off += r.HeadLen
		if !r.Interim() {
			return &r, off, nil
		}
	}
}

// FuzzResponseStream: whatever an upstream sends, the client does not
// panic; it accepts a head exactly when httpparse does (a 101 aside, which
// it refuses); a Content-Length body it returns whole is exactly that
// long; and the outcome (head, body, trailers, errors) does not depend
// on how the bytes were split into reads. The first byte picks the
// method and the read size.
func FuzzResponseStream(f *testing.F) {
	for _, s := range streamSeeds() {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		if len(in) < 1 || len(in) > 64<<10 {
			return
		}
		sel, data := in[0], in[1:]
		method := "GET"
		if sel&0x80 != 0 {
			method = "HEAD"
		}
		step := 1 + int(sel&0x0f)
		whole, werr := readStream(t, method, data, len(data)+1)
		split, _ := readStream(t, method, data, step)
		if !reflect.DeepEqual(whole, split) {
			t.Fatalf("read whole: %+v\nread %d bytes at a time: %+v", whole, step, split)
		}
		resp, _, perr := verdict(method, data)
		switch {
		case perr != nil && !whole.HeadErr:
			t.Fatalf("httpparse refuses the head (%v), the client took it: %+v", perr, whole)
		case perr == nil && resp.Status != 101 && whole.HeadErr:
			t.Fatalf("httpparse accepts the head, the client refused it: %v", werr)
		case perr == nil && resp.Status == 101 && !whole.HeadErr:
			t.Fatalf("the client took a 101: %+v", whole)
		}
		if perr == nil && !whole.HeadErr && resp.BodyMode() == httpparse.BodyLength && !whole.BodyErr &&
			int64(len(whole.Body)) != resp.ContentLength {
			t.Fatalf("a %d-byte body for Content-Length %d", len(whole.Body), resp.ContentLength)
		}
	})
}

// streamSeeds are upstream byte streams, each after its selector byte:
// valid responses of every framing, and malformed ones of every kind.
func streamSeeds() [][]byte {
	streams := []string{
		"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello",
		"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhelloHTTP/1.1 200 OK\r\n\r\n",
		"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nTrailer: X-T\r\n\r\n5;a=b\r\nhello\r\n0\r\nX-T: 1\r\n\r\n",
		"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhel",
		"HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\nHTTP/1.1 204 No Content\r\n\r\n",
		strings.Repeat("HTTP/1.1 100 Continue\r\n\r\n", 6) + "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n",
		"HTTP/1.1 101 Switching Protocols\r\nUpgrade: x\r\nConnection: upgrade\r\n\r\n",
		"HTTP/1.0 200 OK\r\n\r\nclose-delimited",
		"HTTP/1.1 304 Not Modified\r\nContent-Length: 9\r\n\r\n",
		"HTTP/1.1 200 OK\r\nConnection: close\r\nX-A: 1\r\nx-a: 2\r\nETag: \"e\"\r\nContent-Length: 1\r\n\r\nz",
		"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nhello!",
		"HTTP/1.1 200 OK\r\nContent-Length : 5\r\n\r\nhello",
		"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nX-Folded: a\r\n b\r\n\r\nhello",
		"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5 \r\nhello\r\n0\r\n\r\n",
		"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
		"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nX-Nul: a\x00b\r\n\r\nhello",
		"HTTP/1.1 2000 OK\r\nContent-Length: 5\r\n\r\nhello",
		"HTTP/1.1 200 OK\r\nContent-Length: 5\nX-After: 1\r\n\r\nhello",
		"HTTP/1.1 200 OK\r\nContent-Length: +5\r\n\r\nhello",
	}
	seeds := make([][]byte, 0, 2*len(streams))
	for i, s := range streams {
		seeds = append(seeds, append([]byte{byte(i % 16)}, s...))
		if i%3 == 0 {
			seeds = append(seeds, append([]byte{0x80 | byte(i%16)}, s...)) // HEAD
		}
	}
	return seeds
}

// TestFuzzSeedCorpus keeps testdata/fuzz/FuzzResponseStream in step with
// streamSeeds (RL_WRITE_CORPUS=1 rewrites it).
func TestFuzzSeedCorpus(t *testing.T) {
	fuzzcorpus.Sync(t, "FuzzResponseStream", streamSeeds())
}
