package httpparse

import (
	"strings"
	"testing"
)

// TestParseUpstreamInterimBounds: interim responses are counted per
// exchange; the one past MaxInterims, or past MaxInterimBytes together,
// fails; a 101 and final heads are not counted.
func TestParseUpstreamInterimBounds(t *testing.T) {
	hint := "HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n"
	big := "HTTP/1.1 102 Processing\r\nX-Pad: " + strings.Repeat("p", 12<<10) + "\r\n\r\n"
	final := "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"
	switching := "HTTP/1.1 101 Switching Protocols\r\nUpgrade: x\r\nConnection: upgrade\r\n\r\n"
	cases := []struct {
		name    string
		stream  string
		heads   int   // heads parsed without error
		wantErr error // of the head after them (nil: all parsed)
	}{
		{"final only", final, 1, nil},
		{"max interims then final", strings.Repeat(hint, MaxInterims) + final, MaxInterims + 1, nil},
		{"one interim too many", strings.Repeat(hint, MaxInterims+1) + final, MaxInterims, ErrTooManyInterims},
		{"interim bytes past the bound", big + big + big + final, 2, ErrTooManyInterims},
		{"101 is final", strings.Repeat(hint, MaxInterims) + switching, MaxInterims + 1, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var r Response
			var seen Interims
			buf := []byte(tc.stream)
			n := 0
			for {
				err := r.ParseUpstream(buf, []byte("GET"), &seen)
				if err != nil {
					if err != tc.wantErr || n != tc.heads {
						t.Fatalf("after %d heads: %v; want %v after %d", n, err, tc.wantErr, tc.heads)
					}
					return
				}
				n++
				buf = buf[r.HeadLen:]
				if !r.Interim() {
					break
				}
			}
			if tc.wantErr != nil || n != tc.heads || len(buf) != 0 {
				t.Fatalf("%d heads parsed, %d bytes left; want %d heads, then %v", n, len(buf), tc.heads, tc.wantErr)
			}
		})
	}
}

// TestParseUpstreamLimits: an upstream head is held to the package
// defaults.
func TestParseUpstreamLimits(t *testing.T) {
	var r Response
	var seen Interims
	fields := strings.Repeat("X-A: b\r\n", DefaultMaxHeaders+1)
	if err := r.ParseUpstream([]byte("HTTP/1.1 200 OK\r\n"+fields+"\r\n"), []byte("GET"), &seen); err != ErrTooManyHeaders {
		t.Fatalf("%d fields: %v, want %v", DefaultMaxHeaders+1, err, ErrTooManyHeaders)
	}
	head := "HTTP/1.1 200 OK\r\nX-Pad: " + strings.Repeat("p", DefaultMaxHeaderBytes) + "\r\n\r\n"
	if err := r.ParseUpstream([]byte(head), []byte("GET"), &seen); err != ErrHeaderTooBig {
		t.Fatalf("a %d-byte head: %v, want %v", len(head), err, ErrHeaderTooBig)
	}
}

func TestResponseReusable(t *testing.T) {
	cases := []struct {
		name, head, method string
		want               bool
	}{
		{"1.1 with length", "HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\n", "GET", true},
		{"1.1 chunked", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n", "GET", true},
		{"no body", "HTTP/1.1 204 No Content\r\n\r\n", "GET", true},
		{"connection close", "HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 1\r\n\r\n", "GET", false},
		{"close-delimited", "HTTP/1.1 200 OK\r\n\r\n", "GET", false},
		{"1.0 keep-alive", "HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nContent-Length: 1\r\n\r\n", "GET", false},
		{"101", "HTTP/1.1 101 Switching Protocols\r\nUpgrade: x\r\nConnection: upgrade\r\n\r\n", "GET", false},
		{"2xx to CONNECT", "HTTP/1.1 200 OK\r\n\r\n", "CONNECT", false},
		{"407 to CONNECT", "HTTP/1.1 407 Auth\r\nContent-Length: 0\r\n\r\n", "CONNECT", true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var r Response
			if err := r.Parse([]byte(tc.head), Limits{}, []byte(tc.method)); err != nil {
				t.Fatal(err)
			}
			if got := r.Reusable([]byte(tc.method)); got != tc.want {
				t.Fatalf("Reusable = %v, want %v", got, tc.want)
			}
		})
	}
}
