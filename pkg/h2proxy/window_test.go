package h2proxy_test

import (
	"bytes"
	"io"
	"net"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"

	"github.com/rl-tproxy/rl-tproxy/pkg/exchange"
	"github.com/rl-tproxy/rl-tproxy/pkg/h2proxy"
)

// rawUpstream accepts one h2c connection from the proxy and returns its
// framer after the preface and the proxy's SETTINGS (returned too).
func rawUpstream(t *testing.T, ln net.Listener) (*http2.Framer, net.Conn, *http2.SettingsFrame) {
	t.Helper()
	c, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	_ = c.SetDeadline(time.Now().Add(30 * time.Second)) // hang guard
	pre := make([]byte, len(http2.ClientPreface))
	if _, err := io.ReadFull(c, pre); err != nil || string(pre) != http2.ClientPreface {
		t.Fatalf("upstream preface %q: %v", pre, err)
	}
	fr := http2.NewFramer(c, c)
	f, err := fr.ReadFrame()
	if err != nil {
		t.Fatal(err)
	}
	sf, ok := f.(*http2.SettingsFrame)
	if !ok {
		t.Fatalf("first frame %v, want SETTINGS", f.Header())
	}
	if err := fr.WriteSettings(); err != nil {
		t.Fatal(err)
	}
	return fr, c, sf
}

// TestUpstreamWindowBounded: the proxy holds at most
// UpstreamStreamWindow of a response its client does not take. A client
// with a zero window asks for a response; the upstream (raw frames) sees
// the proxy advertise that window and, when it sends past it while the
// client takes nothing, gets a flow-control error (RST_STREAM or GOAWAY
// FLOW_CONTROL_ERROR, or the connection closed): the proxy never buffers
// more.
func TestUpstreamWindowBounded(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	_, addr := startProxy(t, &exchange.Service{Name: "w", Upstream: ln.Addr().String(), UpstreamProtocol: h2proxy.ProtoH2C}, nil)

	// The client: window 0, one GET.
	cc, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	_, _ = io.WriteString(cc, http2.ClientPreface)
	cfr := http2.NewFramer(cc, cc)
	if err := cfr.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: 0}); err != nil {
		t.Fatal(err)
	}
	var hb bytes.Buffer
	he := hpack.NewEncoder(&hb)
	for _, f := range [][2]string{{":method", "GET"}, {":scheme", "http"}, {":path", "/big"}, {":authority", "w.test"}} {
		_ = he.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]})
	}
	if err := cfr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: hb.Bytes(), EndHeaders: true, EndStream: true}); err != nil {
		t.Fatal(err)
	}
	go func() { // the client reads (frames, SETTINGS ACKs) but grants no window
		for {
			f, err := cfr.ReadFrame()
			if err != nil {
				return
			}
			if sf, ok := f.(*http2.SettingsFrame); ok && !sf.IsAck() {
				_ = cfr.WriteSettingsAck()
			}
		}
	}()

	fr, _, sf := rawUpstream(t, ln)
	win, ok := sf.Value(http2.SettingInitialWindowSize)
	if !ok {
		win = 65535
	}
	if win > h2proxy.UpstreamStreamWindow {
		t.Fatalf("proxy advertises a stream window of %d to its upstream, want <= %d", win, h2proxy.UpstreamStreamWindow)
	}
	var sid uint32
	for sid == 0 {
		f, err := fr.ReadFrame()
		if err != nil {
			t.Fatal(err)
		}
		switch f := f.(type) {
		case *http2.SettingsFrame:
			if !f.IsAck() {
				_ = fr.WriteSettingsAck()
			}
		case *http2.HeadersFrame:
			sid = f.StreamID
		}
	}
	hb.Reset()
	_ = he.WriteField(hpack.HeaderField{Name: ":status", Value: "200"})
	if err := fr.WriteHeaders(http2.HeadersFrameParam{StreamID: sid, BlockFragment: hb.Bytes(), EndHeaders: true}); err != nil {
		t.Fatal(err)
	}
	// Send the window, then past it by more than the proxy can have
	// consumed (its copy buffer and the client-side writer's): a
	// proxy that kept the bound answers a flow-control error. The
	// upstream's writes run beside the read loop (the proxy's connection
	// window updates).
	errs := make(chan http2.ErrCode, 4)
	go func() {
		for {
			f, err := fr.ReadFrame()
			if err != nil {
				close(errs)
				return
			}
			switch f := f.(type) {
			case *http2.RSTStreamFrame:
				errs <- f.ErrCode
			case *http2.GoAwayFrame:
				errs <- f.ErrCode
			}
		}
	}()
	chunk := make([]byte, 16<<10)
	total := int(win) + 128<<10
	go func() {
		for sent := 0; sent < total; sent += len(chunk) {
			if err := fr.WriteData(sid, false, chunk); err != nil {
				return
			}
		}
	}()
	select {
	case code, ok := <-errs:
		if !ok {
			// The transport treats the overrun as a connection error
			// and closes the connection; its GOAWAY can be lost to
			// the reset the unread DATA causes.
			t.Log("the proxy closed the upstream connection")
			return
		}
		if code != http2.ErrCodeFlowControl {
			t.Fatalf("proxy answered %v, want FLOW_CONTROL_ERROR", code)
		}
	case <-time.After(20 * time.Second): // hang guard
		t.Fatalf("%d bytes sent past a stalled client, no flow-control error: the proxy buffered them", total)
	}
}
