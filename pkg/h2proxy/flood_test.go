package h2proxy_test

import (
	"fmt"
	"net"
	"net/http"
	"sync"
	"testing"
	"time"

	"golang.org/x/net/http2"

	"github.com/rl-tproxy/rl-tproxy/pkg/exchange"
)

// TestFrameFloods: a client that sends frames which ask for nothing (SETTINGS,
// PRIORITY, WINDOW_UPDATE, empty DATA, empty CONTINUATION) past the
// connection's budget gets GOAWAY ENHANCE_YOUR_CALM, the flood is counted by
// its frame type, and another client is served meanwhile.
func TestFrameFloods(t *testing.T) {
	for _, tc := range []struct {
		name, kind string
		open       func(rc *rawClient) // what comes before the flood
		send       func(rc *rawClient) error
	}{
		{"settings", "conn_ENHANCE_YOUR_CALM_flood_settings", nil,
			func(rc *rawClient) error { return rc.fr.WriteSettings() }},
		{"priority", "conn_ENHANCE_YOUR_CALM_flood_priority", nil,
			func(rc *rawClient) error {
				return rc.fr.WritePriority(3, http2.PriorityParam{StreamDep: 0, Weight: 15})
			}},
		{"window update", "conn_ENHANCE_YOUR_CALM_flood_window_update", nil,
			func(rc *rawClient) error { return rc.fr.WriteWindowUpdate(0, 1) }},
		{"empty data", "conn_ENHANCE_YOUR_CALM_flood_empty_data",
			func(rc *rawClient) { // a stream held in admission, its body open
				_ = rc.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: rc.headerBlock("/slow"), EndHeaders: true})
			},
			func(rc *rawClient) error { return rc.fr.WriteData(1, false, nil) }},
		{"empty continuation", "conn_ENHANCE_YOUR_CALM_flood_empty_continuation",
			func(rc *rawClient) { // a header block left open
				_ = rc.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: rc.headerBlock("/x")})
			},
			func(rc *rawClient) error { return rc.fr.WriteContinuation(1, false, nil) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := &rec{deny: map[string]bool{"/ok": true}, blockPath: "/slow"}
			srv, addr := startProxy(t, &exchange.Service{Name: "f", Upstream: "127.0.0.1:9"}, h)
			var mu sync.Mutex
			counted := map[string]int{}
			srv.CountError = func(k string) { mu.Lock(); counted[k]++; mu.Unlock() }
			rc := dialRaw(t, addr)
			if tc.open != nil {
				tc.open(rc)
			}
			const offered = 200000
			go func() {
				for range offered {
					if tc.send(rc) != nil {
						return
					}
				}
				_ = rc.c.(*net.TCPConn).CloseWrite()
			}()
			checkServing(t, addr)
			code, gotGoaway := rc.readUntilGone()
			if !gotGoaway || code != http2.ErrCodeEnhanceYourCalm {
				t.Fatalf("after %d frames offered: goaway %v, code %v; want GOAWAY ENHANCE_YOUR_CALM", offered, gotGoaway, code)
			}
			mu.Lock()
			n, all := counted[tc.kind], fmt.Sprint(counted)
			mu.Unlock()
			if n != 1 {
				t.Fatalf("%s counted %d times by the time the client read the GOAWAY (%s)", tc.kind, n, all)
			}
			checkServing(t, addr)
		})
	}
}

// TestFrameBudgetKeepsClients: what a busy legitimate client sends stays
// inside the budget: a SETTINGS frame and a PRIORITY frame per request
// over 300 requests, and a WINDOW_UPDATE for every DATA frame of a large
// download, on one connection that is never told to calm down.
func TestFrameBudgetKeepsClients(t *testing.T) {
	big := make([]byte, 4<<20)
	up := serveHTTP(t, true, &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = w.Write(big)
	})})
	h := &rec{deny: map[string]bool{"/ok": true}}
	_, addr := startProxy(t, &exchange.Service{Name: "k", Upstream: up}, h)
	rc := dialRaw(t, addr)
	_ = rc.c.SetDeadline(time.Now().Add(60 * time.Second)) // hang guard
	// readStream reads until stream id ends, granting a WINDOW_UPDATE
	// (stream and connection) for every DATA frame; it returns the
	// stream's body bytes.
	readStream := func(id uint32) int {
		got := 0
		for {
			f, err := rc.fr.ReadFrame()
			if err != nil {
				t.Fatalf("stream %d, after %d body bytes: %v", id, got, err)
			}
			switch f := f.(type) {
			case *http2.GoAwayFrame:
				t.Fatalf("GOAWAY %v on stream %d after %d body bytes", f.ErrCode, id, got)
			case *http2.RSTStreamFrame:
				t.Fatalf("stream %d reset: %v", f.StreamID, f.ErrCode)
			case *http2.DataFrame:
				if n := uint32(len(f.Data())); n > 0 {
					_ = rc.fr.WriteWindowUpdate(f.StreamID, n)
					_ = rc.fr.WriteWindowUpdate(0, n)
				}
				if f.StreamID == id {
					got += len(f.Data())
				}
				if f.StreamEnded() && f.StreamID == id {
					return got
				}
			case *http2.HeadersFrame:
				if f.StreamEnded() && f.StreamID == id {
					return got
				}
			case *http2.SettingsFrame:
				if !f.IsAck() {
					_ = rc.fr.WriteSettingsAck()
				}
			}
		}
	}
	id := uint32(1)
	for i := 0; i < 300; i++ {
		if err := rc.fr.WriteSettings(); err != nil {
			t.Fatal(err)
		}
		if err := rc.fr.WritePriority(id, http2.PriorityParam{Weight: 15}); err != nil {
			t.Fatal(err)
		}
		if err := rc.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: rc.headerBlock("/ok"), EndHeaders: true, EndStream: true}); err != nil {
			t.Fatal(err)
		}
		readStream(id)
		id += 2
	}
	if err := rc.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: rc.headerBlock("/big"), EndHeaders: true, EndStream: true}); err != nil {
		t.Fatal(err)
	}
	got := readStream(id)
	if got != len(big) {
		t.Fatalf("download: %d of %d bytes", got, len(big))
	}
}

// TestSettingsRepeatedParameter (RFC 9113 6.5.3, h2spec 6.5.3 #1): a
// SETTINGS frame that names SETTINGS_INITIAL_WINDOW_SIZE twice is applied
// in order: the connection goes on, and the response's DATA frames follow
// the last value (1 byte).
func TestSettingsRepeatedParameter(t *testing.T) {
	up := serveHTTP(t, true, &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = w.Write([]byte("hello"))
	})})
	_, addr := startProxy(t, &exchange.Service{Name: "s", Upstream: up}, &rec{})
	rc := dialRaw(t, addr)
	_ = rc.c.SetDeadline(time.Now().Add(30 * time.Second)) // hang guard
	if err := rc.fr.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: 100},
		http2.Setting{ID: http2.SettingInitialWindowSize, Val: 1}); err != nil {
		t.Fatal(err)
	}
	// A PING after it: its answer comes once the SETTINGS frame was
	// processed (the codec may answer two SETTINGS frames read together
	// with one ACK, so ACKs are not counted).
	if err := rc.fr.WritePing(false, [8]byte{'s'}); err != nil {
		t.Fatal(err)
	}
	for pinged := false; !pinged; {
		f, err := rc.fr.ReadFrame()
		if err != nil {
			t.Fatalf("before the PING answer: %v", err)
		}
		switch f := f.(type) {
		case *http2.GoAwayFrame:
			t.Fatalf("GOAWAY %v: the repeated parameter was refused", f.ErrCode)
		case *http2.SettingsFrame:
			if !f.IsAck() {
				_ = rc.fr.WriteSettingsAck()
			}
		case *http2.PingFrame:
			pinged = f.IsAck()
		}
	}
	if err := rc.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: rc.headerBlock("/w"), EndHeaders: true, EndStream: true}); err != nil {
		t.Fatal(err)
	}
	for {
		f, err := rc.fr.ReadFrame()
		if err != nil {
			t.Fatal(err)
		}
		switch f := f.(type) {
		case *http2.GoAwayFrame:
			t.Fatalf("GOAWAY %v", f.ErrCode)
		case *http2.DataFrame:
			if n := len(f.Data()); n != 1 {
				t.Fatalf("first DATA frame of %d bytes, want 1 (the last INITIAL_WINDOW_SIZE)", n)
			}
			return
		}
	}
}
