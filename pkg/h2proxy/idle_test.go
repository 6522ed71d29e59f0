package h2proxy_test

import (
	"io"
	"net/http"
	"net/netip"
	"sync"
	"testing"
	"time"

	"golang.org/x/net/http2"

	"github.com/rl-tproxy/rl-tproxy/internal/testkit"
	"github.com/rl-tproxy/rl-tproxy/pkg/exchange"
)

// rejRec is rec that also records the rules of Reject.
type rejRec struct {
	*rec
	rmu   sync.Mutex
	rules map[string]int
}

func (h *rejRec) Reject(_ *exchange.Service, _ netip.AddrPort, rule string, status int) {
	h.rmu.Lock()
	defer h.rmu.Unlock()
	if h.rules == nil {
		h.rules = map[string]int{}
	}
	h.rules[rule]++
}

func (h *rejRec) rule(r string) int {
	h.rmu.Lock()
	defer h.rmu.Unlock()
	return h.rules[r]
}

// TestStreamIdleTimeouts: the service's idle timeout ends a stream whose
// client sends no body (HEADERS without END_STREAM, then nothing; 50 at
// once), and one whose client takes no response data (a zero window: a
// relayed response, and the proxy's own deny answer). Each stream is
// reset, counted as a rejection under its rule, and ends with Done as a
// client abort; the connection's other work is unaffected.
func TestStreamIdleTimeouts(t *testing.T) {
	big := make([]byte, 1<<20)
	up := serveHTTP(t, true, &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		_, _ = w.Write(big)
	})})
	const idle = 300 * time.Millisecond
	for _, tc := range []struct {
		name    string
		window  uint32 // the client's initial stream window
		path    string
		body    bool // the stream stays open for a body never sent
		streams int
		rule    string
	}{
		{"bodiless streams", 65535, "/up", true, 50, "body-timeout"},
		{"zero window relay", 0, "/up", false, 1, "send-timeout"},
		{"zero window deny", 0, "/ok", false, 1, "send-timeout"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := &rejRec{rec: &rec{deny: map[string]bool{"/ok": true}}}
			_, addr := startProxy(t, &exchange.Service{Name: "i", Upstream: up, IdleTimeout: idle}, h)
			rc := dialRaw(t, addr)
			_ = rc.c.SetDeadline(time.Now().Add(40 * idle)) // hang guard
			if err := rc.fr.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: tc.window}); err != nil {
				t.Fatal(err)
			}
			for i := 0; i < tc.streams; i++ {
				if err := rc.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: uint32(2*i + 1),
					BlockFragment: rc.headerBlock(tc.path), EndHeaders: true, EndStream: !tc.body}); err != nil {
					t.Fatal(err)
				}
			}
			resets := map[uint32]http2.ErrCode{}
			for len(resets) < tc.streams {
				f, err := rc.fr.ReadFrame()
				if err != nil {
					t.Fatalf("%d of %d streams reset: %v", len(resets), tc.streams, err)
				}
				switch f := f.(type) {
				case *http2.RSTStreamFrame:
					resets[f.StreamID] = f.ErrCode
				case *http2.DataFrame:
					if f.StreamEnded() {
						t.Fatalf("stream %d completed", f.StreamID)
					}
				case *http2.SettingsFrame:
					if !f.IsAck() {
						_ = rc.fr.WriteSettingsAck()
					}
				case *http2.GoAwayFrame:
					t.Fatalf("GOAWAY %v with %d of %d streams reset", f.ErrCode, len(resets), tc.streams)
				}
			}
			testkit.WaitFor(t, "Done of every stream", func() bool { return h.doneCount() == tc.streams })
			if n := h.rule(tc.rule); n != tc.streams {
				t.Fatalf("%s counted %d times, want %d (%v)", tc.rule, n, tc.streams, h.rules)
			}
			h.mu.Lock()
			defer h.mu.Unlock()
			for _, res := range h.dones {
				if !res.ClientAborted {
					t.Fatalf("Done without ClientAborted: %+v", res)
				}
			}
		})
	}
}
