package h2proxy_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"

	"github.com/rl-tproxy/rl-tproxy/pkg/exchange"
	"github.com/rl-tproxy/rl-tproxy/pkg/h2proxy"
)

var fuzzSvc = &exchange.Service{Name: "fuzz", Upstream: "127.0.0.1:9", Limits: limits(20)}

// FuzzH2Conn feeds arbitrary frames (after a valid preface) to a served
// connection whose every stream is denied: whatever the bytes, Serve
// returns once the client is gone, answers only with frames, and never
// reaches the upstream.
//
// Each input costs about a second (the codec lingers after GOAWAY):
// fuzz.sh budget: 8x
func FuzzH2Conn(f *testing.F) {
	for _, s := range fuzzSeeds() {
		f.Add(s)
	}
	srv := h2proxy.New()
	cfg := &exchange.Config{Services: []*exchange.Service{fuzzSvc}, Hook: &rec{deny: map[string]bool{"/": true, "/x": true}}}
	f.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
	})
	f.Fuzz(func(t *testing.T, frames []byte) { runFuzzOne(t, srv, cfg, frames) })
}

// runFuzzOne serves one connection carrying frames.
func runFuzzOne(t *testing.T, srv *h2proxy.Server, cfg *exchange.Config, frames []byte) {
	{
		client, server := net.Pipe()
		done := make(chan struct{})
		go func() { srv.Serve(server, nil, fuzzSvc, cfg); close(done) }()
		go func() {
			_, _ = io.WriteString(client, http2.ClientPreface)
			_, _ = client.Write(frames)
		}()
		_ = client.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
		fr := http2.NewFramer(io.Discard, client)
		for {
			if _, err := fr.ReadFrame(); err != nil {
				if _, isConnErr := err.(http2.ConnectionError); !isTimeoutOrEOF(err) && !isConnErr {
					t.Fatalf("the proxy wrote something that is not a frame: %v", err)
				}
				break
			}
		}
		_ = client.Close()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Fatal("Serve did not return after the client closed")
		}
	}
}

func isTimeoutOrEOF(err error) bool {
	if ne, ok := err.(net.Error); ok && ne.Timeout() {
		return true
	}
	return err == io.EOF || err == io.ErrUnexpectedEOF || err == io.ErrClosedPipe
}

// fuzzSeeds are the committed corpus's inputs: a request, a request split
// over CONTINUATION, a reset stream, a bad frame size, settings and pings,
// a flood of each kind the control-frame budget covers, and flow-control
// window shapes.
func fuzzSeeds() [][]byte {
	var out [][]byte
	frame := func(write func(fr *http2.Framer)) {
		var b bytes.Buffer
		fr := http2.NewFramer(&b, nil)
		_ = fr.WriteSettings()
		write(fr)
		out = append(out, b.Bytes())
	}
	var hb bytes.Buffer
	he := hpack.NewEncoder(&hb)
	for _, f := range [][2]string{{":method", "GET"}, {":scheme", "http"}, {":path", "/x"}, {":authority", "a"}, {"content-type", "application/grpc"}} {
		_ = he.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]})
	}
	block := append([]byte(nil), hb.Bytes()...)
	frame(func(fr *http2.Framer) {
		_ = fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: block, EndHeaders: true, EndStream: true})
	})
	frame(func(fr *http2.Framer) {
		_ = fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: block[:3]})
		_ = fr.WriteContinuation(1, true, block[3:])
	})
	frame(func(fr *http2.Framer) {
		_ = fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 3, BlockFragment: block, EndHeaders: true})
		_ = fr.WriteData(3, false, []byte("body"))
		_ = fr.WriteRSTStream(3, http2.ErrCodeCancel)
	})
	frame(func(fr *http2.Framer) {
		_ = fr.WritePing(false, [8]byte{1})
		_ = fr.WriteWindowUpdate(0, 1<<20)
		_ = fr.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: 1})
	})
	frame(func(fr *http2.Framer) {
		_ = fr.WriteRawFrame(http2.FrameHeaders, 0, 1, []byte{0xff, 0xff})
		_ = fr.WriteGoAway(0, http2.ErrCodeNo, nil)
	})
	// Floods past the control-frame budget (guard.go), one per kind.
	const flood = 1100
	frame(func(fr *http2.Framer) {
		for range flood {
			_ = fr.WriteSettings()
		}
	})
	frame(func(fr *http2.Framer) {
		for range flood {
			_ = fr.WritePriority(3, http2.PriorityParam{Weight: 15})
		}
	})
	frame(func(fr *http2.Framer) {
		for range flood {
			_ = fr.WriteWindowUpdate(0, 1)
		}
	})
	frame(func(fr *http2.Framer) {
		_ = fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: block, EndHeaders: true})
		for range flood {
			_ = fr.WriteData(1, false, nil)
		}
	})
	frame(func(fr *http2.Framer) {
		_ = fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: block[:3]})
		for range flood {
			_ = fr.WriteContinuation(1, false, nil)
		}
		_ = fr.WriteContinuation(1, true, block[3:])
	})
	// Window shapes: a zero window, then a request; a repeated
	// INITIAL_WINDOW_SIZE (applied in order) and an invalid one; window
	// updates that overflow the stream's and the connection's window.
	frame(func(fr *http2.Framer) {
		_ = fr.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: 0})
		_ = fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: block, EndHeaders: true, EndStream: true})
		_ = fr.WriteWindowUpdate(1, 1)
		_ = fr.WriteWindowUpdate(1, 1<<31-1)
		_ = fr.WriteWindowUpdate(0, 1<<31-1)
	})
	frame(func(fr *http2.Framer) {
		_ = fr.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: 100},
			http2.Setting{ID: http2.SettingInitialWindowSize, Val: 1},
			http2.Setting{ID: http2.SettingMaxFrameSize, Val: 1 << 14},
			http2.Setting{ID: http2.SettingInitialWindowSize, Val: 7})
		_ = fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: block, EndHeaders: true, EndStream: true})
		_ = fr.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: 1 << 31},
			http2.Setting{ID: http2.SettingInitialWindowSize, Val: 1})
	})
	return out
}

// TestWriteFuzzCorpus regenerates testdata/fuzz/FuzzH2Conn from
// fuzzSeeds when H2PROXY_WRITE_CORPUS=1.
func TestWriteFuzzCorpus(t *testing.T) {
	if os.Getenv("H2PROXY_WRITE_CORPUS") != "1" {
		t.Skip("set H2PROXY_WRITE_CORPUS=1 to regenerate the seed corpus")
	}
	dir := filepath.Join("testdata", "fuzz", "FuzzH2Conn")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for i, s := range fuzzSeeds() {
		body := "go test fuzz v1\n[]byte(" + strconv.Quote(string(s)) + ")\n"
		if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("seed%d", i)), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}
