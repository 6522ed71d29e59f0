package httpparse

import (
	"bytes"
	"errors"
	"fmt"
	"strings"
	"testing"
)

const okGET = "GET / HTTP/1.1\r\nHost: example.com\r\n\r\n"

// req builds a request head from a request line and field lines.
func req(line string, fields ...string) string {
	return line + "\r\n" + strings.Join(append(fields, ""), "\r\n") + "\r\n"
}

var requestRuleCases = []struct {
	name   string
	in     string
	lim    Limits
	want   *Error
	status int
}{
	{"te+cl", req("POST / HTTP/1.1", "Host: a", "Transfer-Encoding: chunked", "Content-Length: 3"), Limits{}, ErrTEWithCL, 400},
	{"cl+te", req("POST / HTTP/1.1", "Host: a", "Content-Length: 3", "Transfer-Encoding: chunked"), Limits{}, ErrTEWithCL, 400},
	{"cl differing", req("POST / HTTP/1.1", "Host: a", "Content-Length: 3", "Content-Length: 4"), Limits{}, ErrConflictingLength, 400},
	{"cl differing spelling", req("POST / HTTP/1.1", "Host: a", "Content-Length: 3", "Content-Length: 03"), Limits{}, ErrConflictingLength, 400},
	{"cl sign +", req("POST / HTTP/1.1", "Host: a", "Content-Length: +3"), Limits{}, ErrBadContentLength, 400},
	{"cl sign -", req("POST / HTTP/1.1", "Host: a", "Content-Length: -1"), Limits{}, ErrBadContentLength, 400},
	{"cl inner space", req("POST / HTTP/1.1", "Host: a", "Content-Length: 1 2"), Limits{}, ErrBadContentLength, 400},
	{"cl empty", req("POST / HTTP/1.1", "Host: a", "Content-Length: "), Limits{}, ErrBadContentLength, 400},
	{"cl list", req("POST / HTTP/1.1", "Host: a", "Content-Length: 3, 3"), Limits{}, ErrBadContentLength, 400},
	{"cl hex", req("POST / HTTP/1.1", "Host: a", "Content-Length: 0x10"), Limits{}, ErrBadContentLength, 400},
	{"cl overflow", req("POST / HTTP/1.1", "Host: a", "Content-Length: 9223372036854775808"), Limits{}, ErrContentLengthOverflow, 400},
	{"cl overflow long", req("POST / HTTP/1.1", "Host: a", "Content-Length: 99999999999999999999999"), Limits{}, ErrContentLengthOverflow, 400},
	{"te gzip", req("POST / HTTP/1.1", "Host: a", "Transfer-Encoding: gzip"), Limits{}, ErrTEUnsupported, 501},
	{"te list", req("POST / HTTP/1.1", "Host: a", "Transfer-Encoding: gzip, chunked"), Limits{}, ErrTEUnsupported, 501},
	{"te chunked twice in list", req("POST / HTTP/1.1", "Host: a", "Transfer-Encoding: chunked, chunked"), Limits{}, ErrTEUnsupported, 501},
	{"te empty", req("POST / HTTP/1.1", "Host: a", "Transfer-Encoding: "), Limits{}, ErrTEUnsupported, 501},
	{"te identity", req("POST / HTTP/1.1", "Host: a", "Transfer-Encoding: identity"), Limits{}, ErrTEUnsupported, 501},
	{"te repeated", req("POST / HTTP/1.1", "Host: a", "Transfer-Encoding: chunked", "Transfer-Encoding: chunked"), Limits{}, ErrTERepeated, 501},
	{"te http/1.0", req("POST / HTTP/1.0", "Transfer-Encoding: chunked"), Limits{}, ErrTEHTTP10, 400},
	{"obs-fold", req("GET / HTTP/1.1", "Host: a", "X: a", " b"), Limits{}, ErrObsFold, 400},
	{"obs-fold tab", req("GET / HTTP/1.1", "Host: a", "X: a", "\tb"), Limits{}, ErrObsFold, 400},
	{"leading ws first field", req("GET / HTTP/1.1", " Host: a"), Limits{}, ErrObsFold, 400},
	{"space before colon", req("GET / HTTP/1.1", "Host : a"), Limits{}, ErrSpaceBeforeColon, 400},
	{"tab before colon", req("GET / HTTP/1.1", "Host\t: a"), Limits{}, ErrSpaceBeforeColon, 400},
	{"space in name", req("GET / HTTP/1.1", "Host: a", "X Y: b"), Limits{}, ErrBadHeaderName, 400},
	{"non-token in name", req("GET / HTTP/1.1", "Host: a", "X(Y): b"), Limits{}, ErrBadHeaderName, 400},
	{"non-ascii in name", req("GET / HTTP/1.1", "Host: a", "X\xc3\xa9: b"), Limits{}, ErrBadHeaderName, 400},
	{"empty name", req("GET / HTTP/1.1", "Host: a", ": b"), Limits{}, ErrBadHeaderName, 400},
	{"no colon", req("GET / HTTP/1.1", "Host: a", "Foo"), Limits{}, ErrMissingColon, 400},
	{"ctl in value", req("GET / HTTP/1.1", "Host: a", "X: a\x01b"), Limits{}, ErrBadHeaderValue, 400},
	{"del in value", req("GET / HTTP/1.1", "Host: a", "X: a\x7fb"), Limits{}, ErrBadHeaderValue, 400},
	{"nul in value", req("GET / HTTP/1.1", "Host: a", "X: a\x00b"), Limits{}, ErrNUL, 400},
	{"nul in name", req("GET / HTTP/1.1", "Host: a", "X\x00: b"), Limits{}, ErrNUL, 400},
	{"nul in target", "GET /\x00 HTTP/1.1\r\nHost: a\r\n\r\n", Limits{}, ErrNUL, 400},
	{"bare cr in value", req("GET / HTTP/1.1", "Host: a", "X: a\rb"), Limits{}, ErrBareCR, 400},
	{"bare cr in name", req("GET / HTTP/1.1", "Host: a", "X\r: b"), Limits{}, ErrBareCR, 400},
	{"bare cr request line", "GET /\r HTTP/1.1\r\nHost: a\r\n\r\n", Limits{}, ErrBareCR, 400},
	{"bare lf field", "GET / HTTP/1.1\r\nHost: a\nX: b\r\n\r\n", Limits{}, ErrBareLF, 400},
	{"bare lf request line", "GET / HTTP/1.1\nHost: a\r\n\r\n", Limits{}, ErrBareLF, 400},
	{"bare lf end", "GET / HTTP/1.1\r\nHost: a\r\n\n", Limits{}, ErrBareLF, 400},
	{"missing host", req("GET / HTTP/1.1", "X: a"), Limits{}, ErrMissingHost, 400},
	{"missing host absolute-form", req("GET http://a/ HTTP/1.1"), Limits{}, ErrMissingHost, 400},
	{"repeated host", req("GET / HTTP/1.1", "Host: a", "Host: a"), Limits{}, ErrRepeatedHost, 400},
	{"repeated host 1.0", req("GET / HTTP/1.0", "Host: a", "host: b"), Limits{}, ErrRepeatedHost, 400},
	{"bad host", req("GET / HTTP/1.1", "Host: a/b"), Limits{}, ErrBadHost, 400},
	{"bad host userinfo", req("GET / HTTP/1.1", "Host: u@a"), Limits{}, ErrBadHost, 400},
	{"bad host port", req("GET / HTTP/1.1", "Host: a:8x"), Limits{}, ErrBadHost, 400},
	{"expect other", req("PUT / HTTP/1.1", "Host: a", "Expect: 200-ok"), Limits{}, ErrExpectUnsupported, 417},
	{"connection options 17", req("GET / HTTP/1.1", "Host: a", "Connection: "+options(17)), Limits{}, ErrConnectionOptions, 400},
	{"connection options 17 over two fields", req("GET / HTTP/1.1", "Host: a", "Connection: close, "+options(8), "Connection: "+options(8)), Limits{}, ErrConnectionOptions, 400},
	{"connection options repeated", req("GET / HTTP/1.1", "Host: a", "Connection: "+strings.Repeat("close,", 17)), Limits{}, ErrConnectionOptions, 400},
	{"request line too long", "GET /" + strings.Repeat("a", 100) + " HTTP/1.1\r\nHost: a\r\n\r\n", Limits{MaxRequestLine: 64}, ErrRequestLineTooLong, 414},
	{"request line too long incomplete", "GET /" + strings.Repeat("a", 100), Limits{MaxRequestLine: 64}, ErrRequestLineTooLong, 414},
	{"header block too big", req("GET / HTTP/1.1", "Host: a", "X: "+strings.Repeat("b", 200)), Limits{MaxHeaderBytes: 128}, ErrHeaderTooBig, 431},
	{"header block too big incomplete", "GET / HTTP/1.1\r\nHost: a\r\nX: " + strings.Repeat("b", 200), Limits{MaxHeaderBytes: 128}, ErrHeaderTooBig, 431},
	{"header block default 16KiB", req("GET / HTTP/1.1", "Host: a", "X: "+strings.Repeat("b", 16<<10)), Limits{}, ErrHeaderTooBig, 431},
	{"too many headers", req("GET / HTTP/1.1", "Host: a", "A: 1", "B: 2", "C: 3"), Limits{MaxHeaders: 3}, ErrTooManyHeaders, 431},
	{"version malformed", req("GET / HTTP/1.x", "Host: a"), Limits{}, ErrBadVersion, 400},
	{"version lowercase", req("GET / http/1.1", "Host: a"), Limits{}, ErrBadVersion, 400},
	{"version two digits", req("GET / HTTP/1.10", "Host: a"), Limits{}, ErrBadVersion, 400},
	{"version 2.0", req("GET / HTTP/2.0", "Host: a"), Limits{}, ErrVersionUnsupported, 505},
	{"version 1.2", req("GET / HTTP/1.2", "Host: a"), Limits{}, ErrVersionUnsupported, 505},
	{"version 0.9", req("GET / HTTP/0.9", "Host: a"), Limits{}, ErrVersionUnsupported, 505},
	{"http/0.9 request", "GET /\r\n\r\n", Limits{}, ErrBadRequestLine, 400},
	{"method non-token", req("G(T / HTTP/1.1", "Host: a"), Limits{}, ErrBadMethod, 400},
	{"method non-ascii", req("G\xc3\xa9T / HTTP/1.1", "Host: a"), Limits{}, ErrBadMethod, 400},
	{"empty method", req(" / HTTP/1.1", "Host: a"), Limits{}, ErrBadRequestLine, 400},
	{"double space", req("GET  / HTTP/1.1", "Host: a"), Limits{}, ErrBadRequestLine, 400},
	{"empty target", req("GET  HTTP/1.1", "Host: a"), Limits{}, ErrBadTarget, 400},
	{"trailing space", req("GET / HTTP/1.1 ", "Host: a"), Limits{}, ErrBadRequestLine, 400},
	{"tab separator", req("GET\t/ HTTP/1.1", "Host: a"), Limits{}, ErrBadMethod, 400},
	{"empty line first", "\r\n" + okGET, Limits{}, ErrBadRequestLine, 400},
	{"target fragment", req("GET /a#b HTTP/1.1", "Host: a"), Limits{}, ErrBadTarget, 400},
	{"target non-ascii", req("GET /\xc3\xa9 HTTP/1.1", "Host: a"), Limits{}, ErrBadTarget, 400},
	{"target ctl", req("GET /\x01 HTTP/1.1", "Host: a"), Limits{}, ErrBadTarget, 400},
	{"target bad escape", req("GET /%zz HTTP/1.1", "Host: a"), Limits{}, ErrBadTarget, 400},
	{"target short escape", req("GET /%2 HTTP/1.1", "Host: a"), Limits{}, ErrBadTarget, 400},
	{"target relative", req("GET a/b HTTP/1.1", "Host: a"), Limits{}, ErrBadTarget, 400},
	{"target star non-options", req("GET * HTTP/1.1", "Host: a"), Limits{}, ErrBadTarget, 400},
	{"target ftp scheme", req("GET ftp://a/ HTTP/1.1", "Host: a"), Limits{}, ErrBadTarget, 400},
	{"target userinfo", req("GET http://u@a/ HTTP/1.1", "Host: a"), Limits{}, ErrBadTarget, 400},
	{"target empty authority", req("GET http:///x HTTP/1.1", "Host: a"), Limits{}, ErrBadTarget, 400},
	{"connect path", req("CONNECT /x HTTP/1.1", "Host: a"), Limits{}, ErrBadTarget, 400},
	{"connect no port", req("CONNECT a HTTP/1.1", "Host: a"), Limits{}, ErrBadTarget, 400},
}

func TestRequestRules(t *testing.T) {
	seen := map[*Error]bool{}
	for _, tc := range requestRuleCases {
		t.Run(tc.name, func(t *testing.T) {
			var r Request
			err := r.Parse([]byte(tc.in), tc.lim)
			if err != tc.want {
				t.Fatalf("Parse(%q) = %v, want %v", tc.in, err, tc.want)
			}
			var pe *Error
			if !errors.As(err, &pe) || pe.Status != tc.status {
				t.Fatalf("status = %v, want %d", err, tc.status)
			}
			seen[tc.want] = true
		})
	}
	// Every request-side rule has at least one case.
	for _, e := range AllErrors {
		if e.Status == 502 || strings.HasPrefix(e.Rule, "chunk") {
			continue
		}
		if !seen[e] {
			t.Errorf("rule %s has no request test case", e.Rule)
		}
	}
}

func TestRuleNamesDistinct(t *testing.T) {
	names := map[string]bool{}
	for _, e := range AllErrors {
		if names[e.Rule] {
			t.Errorf("duplicate rule %q", e.Rule)
		}
		names[e.Rule] = true
		switch e.Status {
		case 400, 414, 417, 431, 501, 502, 505:
		default:
			t.Errorf("rule %s: unexpected status %d", e.Rule, e.Status)
		}
	}
}

// options lists n Connection options: o0, o1, ...
func options(n int) string {
	var sb strings.Builder
	for i := range n {
		if i > 0 {
			sb.WriteString(", ")
		}
		fmt.Fprintf(&sb, "o%d", i)
	}
	return sb.String()
}

// TestConnectionOptions: ConnectionOptions lists the options of every
// Connection field in order, and says when dst had no room for them all.
func TestConnectionOptions(t *testing.T) {
	var r Request
	if err := r.Parse([]byte(req("GET / HTTP/1.1", "Host: a", "Connection: X-A ,, keep-alive", "X-A: 1", "connection:\tUpgrade")), Limits{}); err != nil {
		t.Fatal(err)
	}
	got, ok := ConnectionOptions(make([][]byte, 0, 3), r.Headers)
	if !ok || fmt.Sprintf("%q", got) != `["X-A" "keep-alive" "Upgrade"]` {
		t.Fatalf("ConnectionOptions = %q, %v", got, ok)
	}
	got, ok = ConnectionOptions(make([][]byte, 0, 2), r.Headers)
	if ok || len(got) != 2 {
		t.Fatalf("ConnectionOptions with room for 2 = %q, %v; want the first 2 and false", got, ok)
	}
}

func TestRequestAccepts(t *testing.T) {
	type want struct {
		method, target, host string
		minor                int
		cl                   int64
		mode                 BodyMode
		close, exp, upg      bool
		nh                   int
	}
	cases := []struct {
		name string
		in   string
		w    want
	}{
		{"simple", okGET, want{"GET", "/", "example.com", 1, -1, BodyNone, false, false, false, 1}},
		{"cl", req("POST /p?q=1 HTTP/1.1", "Host: a:8080", "Content-Length: 5"), want{"POST", "/p?q=1", "a:8080", 1, 5, BodyLength, false, false, false, 2}},
		{"cl zero", req("POST / HTTP/1.1", "Host: a", "Content-Length: 0"), want{"POST", "/", "a", 1, 0, BodyLength, false, false, false, 2}},
		{"cl repeated same", req("POST / HTTP/1.1", "Host: a", "Content-Length: 7", "content-length:7"), want{"POST", "/", "a", 1, 7, BodyLength, false, false, false, 3}},
		{"cl max", req("POST / HTTP/1.1", "Host: a", "Content-Length: 9223372036854775807"), want{"POST", "/", "a", 1, 9223372036854775807, BodyLength, false, false, false, 2}},
		{"chunked", req("POST / HTTP/1.1", "Host: a", "Transfer-Encoding: Chunked"), want{"POST", "/", "a", 1, -1, BodyChunked, false, false, false, 2}},
		{"close", req("GET / HTTP/1.1", "Host: a", "Connection: keep-alive, Close"), want{"GET", "/", "a", 1, -1, BodyNone, true, false, false, 2}},
		{"http10 default close", req("GET / HTTP/1.0"), want{"GET", "/", "", 0, -1, BodyNone, true, false, false, 0}},
		{"http10 keep-alive", req("GET / HTTP/1.0", "Connection: Keep-Alive"), want{"GET", "/", "", 0, -1, BodyNone, false, false, false, 1}},
		{"http10 expect ignored", req("PUT / HTTP/1.0", "Expect: 100-continue", "Content-Length: 1"), want{"PUT", "/", "", 0, 1, BodyLength, true, false, false, 2}},
		{"expect", req("PUT / HTTP/1.1", "Host: a", "Expect: 100-Continue", "Content-Length: 1"), want{"PUT", "/", "a", 1, 1, BodyLength, false, true, false, 3}},
		{"upgrade", req("GET /ws HTTP/1.1", "Host: a", "Upgrade: websocket", "Connection: Upgrade"), want{"GET", "/ws", "a", 1, -1, BodyNone, false, false, true, 3}},
		{"upgrade without connection", req("GET /ws HTTP/1.1", "Host: a", "Upgrade: websocket"), want{"GET", "/ws", "a", 1, -1, BodyNone, false, false, false, 2}},
		{"absolute form", req("GET http://b.example:81/x?y HTTP/1.1", "Host: other"), want{"GET", "http://b.example:81/x?y", "b.example:81", 1, -1, BodyNone, false, false, false, 1}},
		{"absolute form ipv6", req("GET https://[::1]:443 HTTP/1.1", "Host: x"), want{"GET", "https://[::1]:443", "[::1]:443", 1, -1, BodyNone, false, false, false, 1}},
		{"options star", req("OPTIONS * HTTP/1.1", "Host: a"), want{"OPTIONS", "*", "a", 1, -1, BodyNone, false, false, false, 1}},
		{"connect", req("CONNECT a.example:443 HTTP/1.1", "Host: a.example:443"), want{"CONNECT", "a.example:443", "a.example:443", 1, -1, BodyNone, false, false, false, 1}},
		{"empty host", req("GET / HTTP/1.1", "Host:"), want{"GET", "/", "", 1, -1, BodyNone, false, false, false, 1}},
		{"ows values and obs-text", req("GET /%41 HTTP/1.1", "Host: \t a \t", "X-A:\tv\xff w "), want{"GET", "/%41", "a", 1, -1, BodyNone, false, false, false, 2}},
		{"odd but legal target bytes", req("GET /a|b{c}^d?x=\"1\"&y=[2] HTTP/1.1", "Host: a"), want{"GET", "/a|b{c}^d?x=\"1\"&y=[2]", "a", 1, -1, BodyNone, false, false, false, 1}},
		{"extension method", req("PROPFIND / HTTP/1.1", "Host: a"), want{"PROPFIND", "/", "a", 1, -1, BodyNone, false, false, false, 1}},
		{"connection options 16, empty elements not counted", req("GET / HTTP/1.1", "Host: a", "Connection: , ,"+options(15)+",, close ,"), want{"GET", "/", "a", 1, -1, BodyNone, true, false, false, 2}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var r Request
			buf := []byte(tc.in + "BODY")
			if err := r.Parse(buf, Limits{}); err != nil {
				t.Fatalf("Parse(%q): %v", tc.in, err)
			}
			got := want{string(r.Method), string(r.Target), string(r.Host), r.Minor, r.ContentLength, r.BodyMode(), r.Close, r.Expect100, r.Upgrade, len(r.Headers)}
			if got != tc.w {
				t.Fatalf("got  %+v\nwant %+v", got, tc.w)
			}
			if r.HeadLen != len(tc.in) {
				t.Fatalf("HeadLen = %d, want %d", r.HeadLen, len(tc.in))
			}
		})
	}
}

func TestRequestHeaderLookup(t *testing.T) {
	var r Request
	in := req("GET / HTTP/1.1", "Host: a", "X-Forwarded-For: 1.2.3.4", "x-forwarded-for: 5.6.7.8", "Connection: close, X-Hop")
	if err := r.Parse([]byte(in), Limits{}); err != nil {
		t.Fatal(err)
	}
	if v, ok := r.Header("X-FORWARDED-FOR"); !ok || string(v) != "1.2.3.4" {
		t.Fatalf("Header = %q %v", v, ok)
	}
	if _, ok := r.HeaderValue("missing"); ok {
		t.Fatal("found missing header")
	}
	if !r.HeaderHas("connection", "x-hop") || r.HeaderHas("connection", "keep-alive") {
		t.Fatal("HeaderHas")
	}
	if !ConnectionHas(r.Headers, []byte("X-HOP")) || ConnectionHas(r.Headers, []byte("host")) {
		t.Fatal("ConnectionHas")
	}
	// Name and value slices point into the buffer.
	buf := []byte(in)
	if err := r.Parse(buf, Limits{}); err != nil {
		t.Fatal(err)
	}
	buf[bytes.Index(buf, []byte("1.2.3.4"))] = '9'
	if v, _ := r.Header("x-forwarded-for"); string(v) != "9.2.3.4" {
		t.Fatalf("value does not alias the buffer: %q", v)
	}
}

func TestRequestReuseAndPipelining(t *testing.T) {
	stream := []byte(req("POST /a HTTP/1.1", "Host: a", "Content-Length: 3") + "abc" + req("GET /b HTTP/1.1", "Host: b") + "GET /c HTT")
	var r Request
	if err := r.Parse(stream, Limits{}); err != nil {
		t.Fatal(err)
	}
	if string(r.Target) != "/a" || r.ContentLength != 3 {
		t.Fatalf("first: %q %d", r.Target, r.ContentLength)
	}
	stream = stream[r.HeadLen+3:]
	if err := r.Parse(stream, Limits{}); err != nil {
		t.Fatal(err)
	}
	if string(r.Target) != "/b" || r.ContentLength != -1 || len(r.Headers) != 1 || string(r.Host) != "b" {
		t.Fatalf("second: %q %d %d %q", r.Target, r.ContentLength, len(r.Headers), r.Host)
	}
	if err := r.Parse(stream[r.HeadLen:], Limits{}); err != ErrNeedMore {
		t.Fatalf("third: %v", err)
	}
}

// TestRequestIncremental feeds every case byte by byte (every prefix): each
// proper prefix yields ErrNeedMore or the final error, and the whole input the
// final result.
func TestRequestIncremental(t *testing.T) {
	inputs := []struct {
		in  string
		lim Limits
	}{{okGET, Limits{}}, {req("POST /x HTTP/1.1", "Host: a", "Content-Length: 10", "Transfer-Encoding: chunked"), Limits{}}}
	for _, tc := range requestRuleCases {
		inputs = append(inputs, struct {
			in  string
			lim Limits
		}{tc.in, tc.lim})
	}
	for _, tc := range inputs {
		var r Request
		final := r.Parse([]byte(tc.in), tc.lim)
		checkPrefixes(t, tc.in, final, func(b []byte) error { return r.Parse(b, tc.lim) })
	}
}

func checkPrefixes(t *testing.T, in string, final error, parse func([]byte) error) {
	t.Helper()
	for i := 0; i < len(in); i++ {
		err := parse([]byte(in[:i]))
		if err != ErrNeedMore && err != final {
			t.Fatalf("prefix %d of %q: %v, final %v", i, in, err, final)
		}
	}
}

func TestInvalidValueByte(t *testing.T) {
	// Compare the word-at-a-time scan with the byte table for every byte
	// value at every position of a 20-byte value.
	for c := 0; c < 256; c++ {
		for pos := 0; pos < 20; pos++ {
			v := []byte(strings.Repeat("a\xff b", 5))
			v[pos] = byte(c)
			want := -1
			for i, b := range v {
				if class[b]&cValue == 0 {
					want = i
					break
				}
			}
			if got := invalidValueByte(v); got != want {
				t.Fatalf("byte %#x at %d: got %d want %d", c, pos, got, want)
			}
		}
	}
}

// TestIncompleteHeadDefersRules: while a head is incomplete and within its
// limits Parse only looks for the end of the head; the violation is
// reported once the head is complete (or a limit is reached).
func TestIncompleteHeadDefersRules(t *testing.T) {
	var r Request
	partial := "GET / HTTP/1.1\r\nHost: a\r\nX\x00: y\r\n"
	if err := r.Parse([]byte(partial), Limits{}); err != ErrNeedMore {
		t.Fatalf("partial: %v", err)
	}
	if err := r.Parse([]byte(partial+"\r\n"), Limits{}); err != ErrNUL {
		t.Fatalf("complete: %v", err)
	}
	if err := r.Parse([]byte(partial+strings.Repeat("Y: z\r\n", 30)), Limits{MaxHeaderBytes: 128}); err != ErrNUL {
		t.Fatalf("over the limit, earlier violation first: %v", err)
	}
	var d ChunkedDecoder
	if _, _, err := d.Decode([]byte("0\r\nA\x00: 1\r\n")); err != ErrNeedMore {
		t.Fatalf("partial trailers: %v", err)
	}
}
