package e2e

import (
	"bytes"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"

	"github.com/rl-tproxy/rl-tproxy/internal/testkit"
)

// h2raw is an HTTP/2 prior-knowledge client that writes frames as an
// attacker would.
type h2raw struct {
	c  net.Conn
	fr *http2.Framer
	hb bytes.Buffer
	he *hpack.Encoder
}

func dialH2(t *testing.T, addr string, settings ...http2.Setting) *h2raw {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	_ = c.SetDeadline(time.Now().Add(testkit.WaitBound)) // hang guard
	if _, err := io.WriteString(c, http2.ClientPreface); err != nil {
		t.Fatal(err)
	}
	h := &h2raw{c: c, fr: http2.NewFramer(c, c)}
	h.he = hpack.NewEncoder(&h.hb)
	if err := h.fr.WriteSettings(settings...); err != nil {
		t.Fatal(err)
	}
	return h
}

func (h *h2raw) request(t *testing.T, id uint32, path string, endStream bool, extra ...string) {
	t.Helper()
	h.hb.Reset()
	fields := append([]string{":method", "GET", ":scheme", "http", ":path", path, ":authority", "e2e.test"}, extra...)
	for i := 0; i+1 < len(fields); i += 2 {
		_ = h.he.WriteField(hpack.HeaderField{Name: fields[i], Value: fields[i+1]})
	}
	if err := h.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: h.hb.Bytes(), EndHeaders: true, EndStream: endStream}); err != nil {
		t.Fatal(err)
	}
}

// until reads frames (answering SETTINGS) until stop returns true for one.
func (h *h2raw) until(t *testing.T, what string, stop func(http2.Frame) bool) http2.Frame {
	t.Helper()
	for {
		f, err := h.fr.ReadFrame()
		if err != nil {
			t.Fatalf("waiting for %s: %v", what, err)
		}
		if sf, ok := f.(*http2.SettingsFrame); ok && !sf.IsAck() {
			_ = h.fr.WriteSettingsAck()
		}
		if stop(f) {
			return f
		}
	}
}

func rstOn(id uint32) func(http2.Frame) bool {
	return func(f http2.Frame) bool {
		_, ok := f.(*http2.RSTStreamFrame)
		return ok && f.Header().StreamID == id
	}
}

// TestH2AbuseThroughBinary: the released binary in front of an h2c
// upstream, in listener mode, against HTTP/2 clients that abuse it. Each
// abuse ends as the docs say, and is counted in
// rl_tproxy_rejections_total: a stream that never sends its body and one
// whose client takes no data are reset at timeouts.idle; a SETTINGS flood
// gets GOAWAY ENHANCE_YOUR_CALM; a request with a connection-specific
// field gets RST_STREAM PROTOCOL_ERROR. A rapid-reset burst on an
// admitted location leaves no admission in flight.
func TestH2AbuseThroughBinary(t *testing.T) {
	big := make([]byte, 1<<20)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var protos http.Protocols
	protos.SetUnencryptedHTTP2(true)
	us := &http.Server{Protocols: &protos, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		_, _ = w.Write(big)
	})}
	go func() { _ = us.Serve(ln) }()
	t.Cleanup(func() { _ = us.Close() })

	listen := freeAddr(t)
	policy := filepath.Join(t.TempDir(), "policy.yaml")
	body := "ratelimitly:\n  embedded: true\n  fail: close\n" +
		"zones:\n  huge: {bucket: \"h2:{remote_addr}\", rate: 4000000000/s, burst: 4000000000}\n" +
		"services:\n  - name: h2\n    listen: " + listen + "\n    upstream: " + ln.Addr().String() + "\n" +
		"    upstream_protocol: h2c\n    timeouts: {idle: 500ms}\n    locations:\n" +
		"      - name: adm\n        match: {path_prefix: /adm}\n        limit: [huge]\n      - name: open\n"
	if err := os.WriteFile(policy, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	p := startProxy(t, policy, true)
	rejected := func(reason string) float64 {
		return p.metric(`rl_tproxy_rejections_total{reason="` + reason + `",status="0"}`)
	}

	t.Run("bodiless stream", func(t *testing.T) {
		h := dialH2(t, listen)
		h.request(t, 1, "/up", false)
		h.until(t, "RST_STREAM", rstOn(1))
		testkit.WaitFor(t, "body-timeout counted", func() bool { return rejected("body-timeout") == 1 })
	})
	t.Run("zero window", func(t *testing.T) {
		h := dialH2(t, listen, http2.Setting{ID: http2.SettingInitialWindowSize, Val: 0})
		h.request(t, 1, "/up", true)
		h.until(t, "RST_STREAM", rstOn(1))
		testkit.WaitFor(t, "send-timeout counted", func() bool { return rejected("send-timeout") == 1 })
	})
	t.Run("settings flood", func(t *testing.T) {
		h := dialH2(t, listen)
		// Its own framer: until answers the proxy's SETTINGS on h.fr
		// meanwhile (net.Conn serialises whole writes; a Framer does not).
		flood := http2.NewFramer(h.c, nil)
		go func() {
			for range 200000 {
				if flood.WriteSettings() != nil {
					return
				}
			}
		}()
		f := h.until(t, "GOAWAY", func(f http2.Frame) bool { _, ok := f.(*http2.GoAwayFrame); return ok })
		if code := f.(*http2.GoAwayFrame).ErrCode; code != http2.ErrCodeEnhanceYourCalm {
			t.Fatalf("GOAWAY %v", code)
		}
		testkit.WaitFor(t, "flood counted", func() bool { return rejected("h2-conn_ENHANCE_YOUR_CALM_flood_settings") == 1 })
	})
	t.Run("connection-specific field", func(t *testing.T) {
		h := dialH2(t, listen)
		h.request(t, 1, "/up", true, "connection", "keep-alive")
		f := h.until(t, "stream 1", func(f http2.Frame) bool { return f.Header().StreamID == 1 })
		if r, ok := f.(*http2.RSTStreamFrame); !ok || r.ErrCode != http2.ErrCodeProtocol {
			t.Fatalf("first frame on the stream %v, want RST_STREAM PROTOCOL_ERROR", f.Header())
		}
		testkit.WaitFor(t, "reset counted", func() bool {
			return rejected("h2-stream_PROTOCOL_ERROR_connection_specific_field") == 1
		})
	})
	t.Run("rapid reset leaves no admission in flight", func(t *testing.T) {
		h := dialH2(t, listen)
		go func() {
			for range 2000 { // drain what the proxy sends
				if _, err := h.fr.ReadFrame(); err != nil {
					return
				}
			}
		}()
		for id := uint32(1); id < 2*20000; id += 2 {
			h.request(t, id, "/adm", true)
			if err := h.fr.WriteRSTStream(id, http2.ErrCodeCancel); err != nil {
				break // the proxy ended the connection (too many early resets)
			}
		}
		_ = h.c.Close()
		testkit.WaitFor(t, "admission_inflight back to 0", func() bool { return p.metric("rl_tproxy_admission_inflight") == 0 })
	})
}
