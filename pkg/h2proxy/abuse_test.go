package h2proxy_test

import (
	"bytes"
	"io"
	"net"
	"net/http"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"

	"github.com/rl-tproxy/rl-tproxy/internal/testkit"
	"github.com/rl-tproxy/rl-tproxy/pkg/exchange"
)

// rawClient is a client that writes frames as an attacker would.
type rawClient struct {
	c  net.Conn
	fr *http2.Framer
	hb bytes.Buffer
	he *hpack.Encoder
}

func dialRaw(t *testing.T, addr string) *rawClient {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	if _, err := io.WriteString(c, http2.ClientPreface); err != nil {
		t.Fatal(err)
	}
	rc := &rawClient{c: c, fr: http2.NewFramer(c, c)}
	rc.he = hpack.NewEncoder(&rc.hb)
	if err := rc.fr.WriteSettings(); err != nil {
		t.Fatal(err)
	}
	return rc
}

func (rc *rawClient) headerBlock(path string, extra ...string) []byte {
	rc.hb.Reset()
	for _, f := range [][2]string{{":method", "GET"}, {":scheme", "http"}, {":path", path}, {":authority", "flood.test"}} {
		_ = rc.he.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]})
	}
	for i := 0; i+1 < len(extra); i += 2 {
		_ = rc.he.WriteField(hpack.HeaderField{Name: extra[i], Value: extra[i+1]})
	}
	return append([]byte(nil), rc.hb.Bytes()...)
}

// readUntilGone reads frames until the connection ends or a GOAWAY
// arrives; it returns the GOAWAY's code (or ErrCodeNo with ok false on a
// plain close).
func (rc *rawClient) readUntilGone() (http2.ErrCode, bool) {
	_ = rc.c.SetReadDeadline(time.Now().Add(30 * time.Second))
	for {
		f, err := rc.fr.ReadFrame()
		if err != nil {
			return http2.ErrCodeNo, false
		}
		if ga, ok := f.(*http2.GoAwayFrame); ok {
			return ga.ErrCode, true
		}
	}
}

func heapInUse() uint64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapInuse
}

// checkServing proves another client is still served: a normal request
// completes.
func checkServing(t *testing.T, addr string) {
	t.Helper()
	cl := h2cClient()
	defer cl.CloseIdleConnections()
	res, err := cl.Get("http://" + addr + "/ok")
	if err != nil {
		t.Fatalf("other client: %v", err)
	}
	_ = res.Body.Close()
	if res.StatusCode != 429 { // the hook denies /ok: an answer without upstream
		t.Fatalf("other client: status %d", res.StatusCode)
	}
}

// TestRapidReset (CVE-2023-44487): a client that opens streams and resets
// them at once, as fast as it can write. Admissions are cancelled, the
// number of handlers stays bounded by the stream limit, the codec ends the
// connection (GOAWAY ENHANCE_YOUR_CALM) or keeps up, memory stays bounded
// and another client keeps being served.
func TestRapidReset(t *testing.T) {
	h := &rec{deny: map[string]bool{"/ok": true}, block: false}
	h.blockPath = "/slow"
	srv, addr := startProxy(t, &exchange.Service{Name: "g", Upstream: "127.0.0.1:9", H2: exchange.H2Limits{MaxConcurrentStreams: 16}}, h)
	var counted sync.Map
	srv.CountError = func(kind string) { counted.Store(kind, true) }
	before := heapInUse()
	goroutines := runtime.NumGoroutine()
	rc := dialRaw(t, addr)
	var written atomic.Int64
	go func() {
		block := rc.headerBlock("/slow")
		for id := uint32(1); id < 2*100000; id += 2 {
			if err := rc.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: block, EndHeaders: true}); err != nil {
				return
			}
			if err := rc.fr.WriteRSTStream(id, http2.ErrCodeCancel); err != nil {
				return
			}
			written.Add(1)
		}
		_ = rc.c.(*net.TCPConn).CloseWrite()
	}()
	checkServing(t, addr)
	code, gotGoaway := rc.readUntilGone()
	t.Logf("streams written %d, goaway %v code %v", written.Load(), gotGoaway, code)
	if gotGoaway && code != http2.ErrCodeEnhanceYourCalm && code != http2.ErrCodeNo {
		t.Errorf("goaway code %v", code)
	}
	if _, ok := counted.Load("conn_ENHANCE_YOUR_CALM_too_many_early_resets"); gotGoaway && code == http2.ErrCodeEnhanceYourCalm && !ok {
		var kinds []string
		counted.Range(func(k, _ any) bool { kinds = append(kinds, k.(string)); return true })
		t.Errorf("CountError did not see too_many_early_resets: %v", kinds)
	}
	_ = rc.c.Close()
	checkServing(t, addr)
	// Every admission that started ends with Done: no leaked state.
	testkit.WaitFor(t, "admissions to end", func() bool {
		h.mu.Lock()
		defer h.mu.Unlock()
		return len(h.dones) == h.admits
	})
	if grown := int64(heapInUse()) - int64(before); grown > 32<<20 {
		t.Errorf("heap grew by %d MiB", grown>>20)
	}
	testkit.WaitFor(t, "handler goroutines to end", func() bool { return runtime.NumGoroutine() <= goroutines+8 })
}

// TestContinuationFlood (CVE-2024-27316): a header block that never ends,
// sent as an endless run of CONTINUATION frames. The codec stops reading
// it once it passes max_header_bytes and ends the connection; memory stays
// bounded and another client keeps being served.
func TestContinuationFlood(t *testing.T) {
	h := &rec{deny: map[string]bool{"/ok": true}}
	_, addr := startProxy(t, &exchange.Service{Name: "g", Upstream: "127.0.0.1:9"}, h)
	before := heapInUse()
	rc := dialRaw(t, addr)
	var sent atomic.Int64
	go func() {
		first := rc.headerBlock("/x")
		if err := rc.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: first}); err != nil {
			return
		}
		// Each frame: one literal field of ~16 KB (never indexed).
		rc.hb.Reset()
		_ = rc.he.WriteField(hpack.HeaderField{Name: "x-junk", Value: strings.Repeat("a", 16000), Sensitive: true})
		frag := append([]byte(nil), rc.hb.Bytes()...)
		for range 16384 { // at most 256 MiB offered
			if err := rc.fr.WriteContinuation(1, false, frag); err != nil {
				return
			}
			sent.Add(int64(len(frag)))
		}
	}()
	_, _ = rc.readUntilGone()
	t.Logf("bytes offered before the connection ended: %d", sent.Load())
	if sent.Load() >= 16384*16000 {
		t.Errorf("the whole flood was accepted")
	}
	_ = rc.c.Close()
	checkServing(t, addr)
	if grown := int64(heapInUse()) - int64(before); grown > 32<<20 {
		t.Errorf("heap grew by %d MiB", grown>>20)
	}
	if h.admittedPath("/x") {
		t.Errorf("a never-ending header block reached admission")
	}
}

// TestHPACKBomb: a small header block that decodes to a huge one (one
// large field inserted in the dynamic table, then referenced many times)
// is refused by size, not decoded into memory.
func TestHPACKBomb(t *testing.T) {
	h := &rec{deny: map[string]bool{"/ok": true}}
	_, addr := startProxy(t, &exchange.Service{Name: "g", Upstream: "127.0.0.1:9"}, h)
	rc := dialRaw(t, addr)
	rc.hb.Reset()
	for _, f := range [][2]string{{":method", "GET"}, {":scheme", "http"}, {":path", "/x"}, {":authority", "bomb.test"}} {
		_ = rc.he.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]})
	}
	big := hpack.HeaderField{Name: "x-b", Value: strings.Repeat("b", 3000)}
	for range 4000 { // ~12 MB decoded from ~12 KB
		_ = rc.he.WriteField(big)
	}
	if err := rc.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: rc.hb.Bytes(), EndHeaders: true, EndStream: true}); err != nil {
		t.Fatal(err)
	}
	// The answer is the codec's 431: the block was not materialised.
	status := ""
	dec := hpack.NewDecoder(4096, func(f hpack.HeaderField) {
		if f.Name == ":status" {
			status = f.Value
		}
	})
	_ = rc.c.SetReadDeadline(time.Now().Add(30 * time.Second))
	for status == "" {
		f, err := rc.fr.ReadFrame()
		if err != nil {
			t.Fatalf("no answer: %v", err)
		}
		if hf, ok := f.(*http2.HeadersFrame); ok && hf.StreamID == 1 {
			_, _ = dec.Write(hf.HeaderBlockFragment())
		}
	}
	if status != "431" {
		t.Errorf("status %s, want 431", status)
	}
	checkServing(t, addr)
	if h.admittedPath("/x") {
		t.Errorf("an oversized header block reached admission")
	}
}

// TestLimits: field count (431), announced body over max_body_bytes (413)
// and CONNECT (501) are answered by the proxy; a streamed body over the
// limit ends the exchange.
func TestLimits(t *testing.T) {
	h := &rec{}
	_, addr := startProxy(t, &exchange.Service{Name: "g", Upstream: "127.0.0.1:9", MaxBodyBytes: 10, Limits: limits(5)}, h)
	cl := h2cClient()
	req, _ := http.NewRequest("GET", "http://"+addr+"/", nil)
	for i := range 6 {
		req.Header.Set("x-h"+string(rune('a'+i)), "v")
	}
	if res, err := cl.Do(req); err != nil || res.StatusCode != 431 {
		t.Fatalf("too many fields: %v %v", res, err)
	}
	res, err := cl.Post("http://"+addr+"/", "text/plain", strings.NewReader(strings.Repeat("x", 11)))
	if err != nil || res.StatusCode != 413 {
		t.Fatalf("body too large: %v %v", res, err)
	}
	if h.admits != 0 {
		t.Errorf("rejected requests reached admission")
	}
	// A streamed body (no content-length) that grows past the limit.
	up := startHTTP(t, true)
	h2 := &rec{}
	_, addr2 := startProxy(t, &exchange.Service{Name: "g2", Upstream: up, MaxBodyBytes: 1000}, h2)
	pr, pw := io.Pipe()
	go func() {
		for range 100 {
			if _, err := pw.Write(make([]byte, 100)); err != nil {
				return
			}
		}
		_ = pw.Close()
	}()
	res, err = cl.Post("http://"+addr2+"/", "application/octet-stream", pr)
	if err == nil {
		_ = res.Body.Close()
		if res.StatusCode != 413 {
			t.Fatalf("streamed body over the limit: %d", res.StatusCode)
		}
	}
	_ = pr.Close()
	testkit.WaitFor(t, "Done", func() bool { return h2.doneCount() == 1 })
	if d := h2.dones[0]; d.BytesIn > 1000+32<<10 || (err == nil && d.Status != 413) {
		t.Errorf("result %+v (client err %v)", d, err)
	}
}

// TestMalformedNotForwarded: a request with a connection-specific field
// or a TE other than "trailers" (RFC 9113 8.2.2) gets RST_STREAM
// PROTOCOL_ERROR before anything else on its stream (h2spec 8.1.2.2),
// never reaches admission, is counted, and the connection goes on: the
// same field again (now from the HPACK dynamic table) is refused the
// same way, and a valid request after it, with TE: trailers, is answered.
func TestMalformedNotForwarded(t *testing.T) {
	h := &rec{deny: map[string]bool{"/ok": true}}
	srv, addr := startProxy(t, &exchange.Service{Name: "g", Upstream: "127.0.0.1:9"}, h)
	var mu sync.Mutex
	counted := 0
	srv.CountError = func(k string) {
		if k == "stream_PROTOCOL_ERROR_connection_specific_field" {
			mu.Lock()
			counted++
			mu.Unlock()
		}
	}
	cases := [][]string{{"connection", "keep-alive"}, {"te", "gzip"}, {"te", "trailers, deflate"}, {"te", "trailers", "te", "trailers"},
		{"transfer-encoding", "chunked"}, {"upgrade", "h2c"}, {"keep-alive", "5"}, {"proxy-connection", "close"}}
	for i, extra := range cases {
		rc := dialRaw(t, addr)
		_ = rc.c.SetReadDeadline(time.Now().Add(30 * time.Second)) // hang guard
		dec := hpack.NewDecoder(4096, func(hpack.HeaderField) {})
		// expect reads until stream id's first frame and returns it,
		// answering SETTINGS.
		expect := func(id uint32) http2.Frame {
			for {
				f, err := rc.fr.ReadFrame()
				if err != nil {
					t.Fatalf("case %d (%v), stream %d: %v", i, extra, id, err)
				}
				if hf, ok := f.(*http2.HeadersFrame); ok {
					_, _ = dec.Write(hf.HeaderBlockFragment()) // keep the table
				}
				if sf, ok := f.(*http2.SettingsFrame); ok && !sf.IsAck() {
					_ = rc.fr.WriteSettingsAck()
				}
				if ga, ok := f.(*http2.GoAwayFrame); ok {
					t.Fatalf("case %d (%v): GOAWAY %v", i, extra, ga.ErrCode)
				}
				if f.Header().StreamID == id {
					return f
				}
			}
		}
		for _, id := range []uint32{1, 3} { // the second time from the dynamic table
			if err := rc.fr.WriteHeaders(http2HeadersEnd(id, rc.headerBlock("/x", extra...))); err != nil {
				t.Fatal(err)
			}
			f := expect(id)
			rst, ok := f.(*http2.RSTStreamFrame)
			if !ok || rst.ErrCode != http2.ErrCodeProtocol {
				t.Fatalf("case %d (%v), stream %d: first frame %v, want RST_STREAM PROTOCOL_ERROR", i, extra, id, f.Header())
			}
		}
		if err := rc.fr.WriteHeaders(http2HeadersEnd(5, rc.headerBlock("/ok", "te", "trailers"))); err != nil {
			t.Fatal(err)
		}
		if f := expect(5); f.Header().Type != http2.FrameHeaders {
			t.Fatalf("case %d (%v): the valid request after got %v", i, extra, f.Header())
		}
		_ = rc.c.Close()
	}
	if h.admittedPath("/x") {
		t.Error("a malformed request reached admission")
	}
	mu.Lock()
	defer mu.Unlock()
	if counted != 2*len(cases) {
		t.Errorf("counted %d, want %d", counted, 2*len(cases))
	}
}

func http2HeadersEnd(id uint32, block []byte) http2.HeadersFrameParam {
	return http2.HeadersFrameParam{StreamID: id, BlockFragment: block, EndHeaders: true, EndStream: true}
}
