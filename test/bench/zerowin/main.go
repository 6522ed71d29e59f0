// Command zerowin is the zero-window client of test/bench/h2window.sh: it
// opens one HTTP/2 prior-knowledge connection with SETTINGS_INITIAL_WINDOW_SIZE
// 0, asks for -streams GETs of -path, waits until every response head
// arrived (the upstream streams are then open and sending), prints
// "heads N", holds the connection -hold long without granting any window,
// then exits. Bench use only.
package main

import (
	"bytes"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:8080", "proxy address")
	path := flag.String("path", "/big", "request path")
	streams := flag.Int("streams", 100, "concurrent streams")
	hold := flag.Duration("hold", 5*time.Second, "how long to hold the connection after the heads")
	flag.Parse()
	if err := run(*addr, *path, *streams, *hold); err != nil {
		fmt.Fprintln(os.Stderr, "zerowin:", err)
		os.Exit(1)
	}
}

func run(addr, path string, streams int, hold time.Duration) error {
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		return fmt.Errorf("dial %s: %w", addr, err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(hold + time.Minute))
	if _, err := io.WriteString(c, http2.ClientPreface); err != nil {
		return fmt.Errorf("preface: %w", err)
	}
	fr := http2.NewFramer(c, c)
	if err := fr.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: 0}); err != nil {
		return fmt.Errorf("settings: %w", err)
	}
	var hb bytes.Buffer
	he := hpack.NewEncoder(&hb)
	for i := 0; i < streams; i++ {
		hb.Reset()
		for _, f := range [][2]string{{":method", "GET"}, {":scheme", "http"}, {":path", path}, {":authority", "zerowin"}} {
			_ = he.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]})
		}
		id := uint32(2*i + 1)
		if err := fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: hb.Bytes(), EndHeaders: true, EndStream: true}); err != nil {
			return fmt.Errorf("headers %d: %w", id, err)
		}
	}
	heads := 0
	for heads < streams {
		f, err := fr.ReadFrame()
		if err != nil {
			return fmt.Errorf("after %d heads: %w", heads, err)
		}
		switch f := f.(type) {
		case *http2.SettingsFrame:
			if !f.IsAck() {
				_ = fr.WriteSettingsAck()
			}
		case *http2.HeadersFrame:
			heads++
		case *http2.RSTStreamFrame:
			return fmt.Errorf("stream %d reset: %v", f.StreamID, f.ErrCode)
		case *http2.GoAwayFrame:
			return fmt.Errorf("goaway: %v", f.ErrCode)
		}
	}
	fmt.Printf("heads %d\n", heads)
	end := time.Now().Add(hold)
	for time.Now().Before(end) { // read (PINGs, SETTINGS) but grant no window
		_ = c.SetReadDeadline(end)
		f, err := fr.ReadFrame()
		if err != nil {
			break
		}
		if sf, ok := f.(*http2.SettingsFrame); ok && !sf.IsAck() {
			_ = fr.WriteSettingsAck()
		}
	}
	return nil
}
