package h2proxy_test

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"sync"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"

	"github.com/rl-tproxy/rl-tproxy/pkg/exchange"
)

// TestUpstreamHeadsNotIndexed: the request heads the proxy sends to an
// h2c upstream add nothing to the HPACK dynamic table, so a field whose
// value changes per request (here X-Request-Id) never makes the encoder
// evict; every field is a static-table index or a literal without
// indexing.
func TestUpstreamHeadsNotIndexed(t *testing.T) {
	up := &rawH2Upstream{}
	addr := up.start(t)
	_, paddr := startProxy(t, &exchange.Service{Name: "s", Upstream: addr, UpstreamProtocol: "h2c"}, nil)
	cl := h2cClient()
	defer cl.CloseIdleConnections()
	for i := range 5 {
		req, err := http.NewRequest(http.MethodGet, "http://"+paddr+"/p", nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("X-Request-Id", "id-"+strconv.Itoa(i)+"-0123456789abcdef")
		res, err := cl.Do(req)
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		_, _ = io.Copy(io.Discard, res.Body)
		_ = res.Body.Close()
		if res.StatusCode != http.StatusOK {
			t.Fatalf("request %d: status %d", i, res.StatusCode)
		}
	}
	blocks := up.heads()
	if len(blocks) != 5 {
		t.Fatalf("upstream saw %d request heads, want 5", len(blocks))
	}
	for i, b := range blocks {
		if err := noIndexing(b); err != nil {
			t.Fatalf("request head %d: %v", i, err)
		}
	}
}

// noIndexing walks an HPACK header block (RFC 7541 6) and fails on a
// literal with incremental indexing or an index into the dynamic table.
func noIndexing(b []byte) error {
	for len(b) > 0 {
		c := b[0]
		var err error
		switch {
		case c&0x80 != 0: // indexed
			var idx uint64
			idx, b, err = hpackInt(b, 7)
			if err == nil && idx > 61 {
				return fmt.Errorf("index %d is in the dynamic table", idx)
			}
		case c&0xc0 == 0x40:
			return fmt.Errorf("literal with incremental indexing (0x%02x)", c)
		case c&0xe0 == 0x20: // dynamic table size update
			_, b, err = hpackInt(b, 5)
		default: // literal without indexing / never indexed
			var name uint64
			name, b, err = hpackInt(b, 4)
			if err == nil && name == 0 {
				b, err = hpackString(b)
			}
			if err == nil {
				b, err = hpackString(b)
			}
		}
		if err != nil {
			return err
		}
	}
	return nil
}

func hpackInt(b []byte, prefix uint) (uint64, []byte, error) {
	if len(b) == 0 {
		return 0, nil, io.ErrUnexpectedEOF
	}
	mask := byte(1<<prefix - 1)
	v := uint64(b[0] & mask)
	b = b[1:]
	if v < uint64(mask) {
		return v, b, nil
	}
	for shift := uint(0); len(b) > 0 && shift < 56; shift += 7 {
		c := b[0]
		b = b[1:]
		v += uint64(c&0x7f) << shift
		if c&0x80 == 0 {
			return v, b, nil
		}
	}
	return 0, nil, io.ErrUnexpectedEOF
}

func hpackString(b []byte) ([]byte, error) {
	n, b, err := hpackInt(b, 7)
	if err != nil {
		return nil, err
	}
	if uint64(len(b)) < n {
		return nil, io.ErrUnexpectedEOF
	}
	return b[n:], nil
}

// rawH2Upstream is an h2c server on the x/net framer that records the
// raw header block of every request and answers 200 with no body.
type rawH2Upstream struct {
	mu     sync.Mutex
	blocks [][]byte
}

func (u *rawH2Upstream) heads() [][]byte {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.blocks
}

func (u *rawH2Upstream) start(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	t.Cleanup(func() { _ = ln.Close(); wg.Wait() })
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() { defer wg.Done(); u.serve(c) }()
		}
	}()
	return ln.Addr().String()
}

func (u *rawH2Upstream) serve(c net.Conn) {
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(30 * time.Second)) // bounds a test gone wrong
	pre := make([]byte, len(http2.ClientPreface))
	if _, err := io.ReadFull(c, pre); err != nil || string(pre) != http2.ClientPreface {
		return
	}
	fr := http2.NewFramer(c, c)
	if fr.WriteSettings() != nil {
		return
	}
	var hbuf bytes.Buffer
	enc := hpack.NewEncoder(&hbuf)
	for {
		f, err := fr.ReadFrame()
		if err != nil {
			return
		}
		switch f := f.(type) {
		case *http2.SettingsFrame:
			if !f.IsAck() && fr.WriteSettingsAck() != nil {
				return
			}
		case *http2.PingFrame:
			if !f.IsAck() && fr.WritePing(true, f.Data) != nil {
				return
			}
		case *http2.HeadersFrame:
			u.mu.Lock()
			u.blocks = append(u.blocks, bytes.Clone(f.HeaderBlockFragment()))
			u.mu.Unlock()
			hbuf.Reset()
			_ = enc.WriteField(hpack.HeaderField{Name: ":status", Value: "200"})
			if fr.WriteHeaders(http2.HeadersFrameParam{StreamID: f.StreamID, BlockFragment: hbuf.Bytes(),
				EndStream: true, EndHeaders: true}) != nil {
				return
			}
		}
	}
}
