package httpparse

import (
	"strings"
	"testing"
)

func resp(line string, fields ...string) string { return req(line, fields...) }

func TestResponseBodyMode(t *testing.T) {
	cases := []struct {
		name   string
		in     string
		method string
		mode   BodyMode
		cl     int64
		close  bool
		status int
	}{
		{"length", resp("HTTP/1.1 200 OK", "Content-Length: 12"), "GET", BodyLength, 12, false, 200},
		{"chunked", resp("HTTP/1.1 200 OK", "Transfer-Encoding: chunked"), "GET", BodyChunked, -1, false, 200},
		{"close-delimited", resp("HTTP/1.1 200 OK", "X: y"), "GET", BodyClose, -1, true, 200},
		{"close-delimited 1.0", resp("HTTP/1.0 200 OK"), "GET", BodyClose, -1, true, 200},
		{"1.0 keep-alive length", resp("HTTP/1.0 200 OK", "Connection: keep-alive", "Content-Length: 1"), "GET", BodyLength, 1, false, 200},
		{"1.0 without keep-alive", resp("HTTP/1.0 200 OK", "Content-Length: 1"), "GET", BodyLength, 1, true, 200},
		{"connection close", resp("HTTP/1.1 200 OK", "Connection: close", "Content-Length: 1"), "GET", BodyLength, 1, true, 200},
		{"head", resp("HTTP/1.1 200 OK", "Content-Length: 12"), "HEAD", BodyNone, -1, false, 200},
		{"head chunked", resp("HTTP/1.1 200 OK", "Transfer-Encoding: chunked"), "HEAD", BodyNone, -1, false, 200},
		{"head no length", resp("HTTP/1.1 200 OK"), "HEAD", BodyNone, -1, false, 200},
		{"100", resp("HTTP/1.1 100 Continue"), "POST", BodyNone, -1, false, 100},
		{"101", resp("HTTP/1.1 101 Switching Protocols", "Upgrade: websocket", "Connection: Upgrade"), "GET", BodyNone, -1, false, 101},
		{"103", resp("HTTP/1.1 103 Early Hints", "Link: </a>"), "GET", BodyNone, -1, false, 103},
		{"204", resp("HTTP/1.1 204 No Content"), "DELETE", BodyNone, -1, false, 204},
		{"204 with length", resp("HTTP/1.1 204 No Content", "Content-Length: 0"), "DELETE", BodyNone, -1, false, 204},
		{"304", resp("HTTP/1.1 304 Not Modified", "Content-Length: 100"), "GET", BodyNone, -1, false, 304},
		{"connect 200", resp("HTTP/1.1 200 Connection established"), "CONNECT", BodyNone, -1, false, 200},
		{"connect 407", resp("HTTP/1.1 407 Auth", "Content-Length: 2"), "CONNECT", BodyLength, 2, false, 407},
		{"empty reason", resp("HTTP/1.1 404 "), "GET", BodyClose, -1, true, 404},
		{"no reason no space", resp("HTTP/1.1 500", "Content-Length: 0"), "GET", BodyLength, 0, false, 500},
		{"odd status", resp("HTTP/1.1 599 Whatever", "Content-Length: 0"), "GET", BodyLength, 0, false, 599},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var r Response
			if err := r.Parse([]byte(tc.in+"rest"), Limits{}, []byte(tc.method)); err != nil {
				t.Fatalf("Parse(%q): %v", tc.in, err)
			}
			if r.BodyMode() != tc.mode || r.ContentLength != tc.cl || r.Close != tc.close || r.Status != tc.status || r.HeadLen != len(tc.in) {
				t.Fatalf("mode %v cl %d close %v status %d headlen %d", r.BodyMode(), r.ContentLength, r.Close, r.Status, r.HeadLen)
			}
			if r.Informational() != (tc.status < 200) {
				t.Fatal("Informational")
			}
			if (tc.status == 101) != r.Upgrade {
				t.Fatal("Upgrade")
			}
		})
	}
}

var responseRuleCases = []struct {
	name string
	in   string
	lim  Limits
	want *Error
}{
	{"status line too long", "HTTP/1.1 200 " + strings.Repeat("x", 100), Limits{MaxRequestLine: 64}, ErrStatusLineTooLong},
	{"no status", resp("HTTP/1.1"), Limits{}, ErrBadStatusLine},
	{"status 2 digits", resp("HTTP/1.1 20 OK"), Limits{}, ErrBadStatusCode},
	{"status 4 digits", resp("HTTP/1.1 2000 OK"), Limits{}, ErrBadStatusCode},
	{"status non-digit", resp("HTTP/1.1 2x0 OK"), Limits{}, ErrBadStatusCode},
	{"status 099", resp("HTTP/1.1 099 OK"), Limits{}, ErrBadStatusCode},
	{"reason ctl", resp("HTTP/1.1 200 O\x01K"), Limits{}, ErrBadStatusLine},
	{"reason nul", resp("HTTP/1.1 200 O\x00K"), Limits{}, ErrNUL},
	{"reason bare cr", resp("HTTP/1.1 200 O\rK"), Limits{}, ErrBareCR},
	{"version", resp("HTTP/1.x 200 OK"), Limits{}, ErrBadVersion},
	{"version 2", resp("HTTP/2.0 200 OK"), Limits{}, ErrVersionUnsupported},
	{"te+cl", resp("HTTP/1.1 200 OK", "Content-Length: 1", "Transfer-Encoding: chunked"), Limits{}, ErrTEWithCL},
	{"te gzip", resp("HTTP/1.1 200 OK", "Transfer-Encoding: gzip, chunked"), Limits{}, ErrTEUnsupported},
	{"te 1.0", resp("HTTP/1.0 200 OK", "Transfer-Encoding: chunked"), Limits{}, ErrTEHTTP10},
	{"cl conflict", resp("HTTP/1.1 200 OK", "Content-Length: 1", "Content-Length: 2"), Limits{}, ErrConflictingLength},
	{"cl bad", resp("HTTP/1.1 200 OK", "Content-Length: -1"), Limits{}, ErrBadContentLength},
	{"cl bad on 304 too", resp("HTTP/1.1 304 Not Modified", "Content-Length: x"), Limits{}, ErrBadContentLength},
	{"obs-fold", resp("HTTP/1.1 200 OK", "X: a", " b"), Limits{}, ErrObsFold},
	{"space before colon", resp("HTTP/1.1 200 OK", "X : a"), Limits{}, ErrSpaceBeforeColon},
	{"bare lf", "HTTP/1.1 200 OK\r\nX: a\n\r\n", Limits{}, ErrBareLF},
	{"header too big", resp("HTTP/1.1 200 OK", "X: "+strings.Repeat("a", 200)), Limits{MaxHeaderBytes: 100}, ErrHeaderTooBig},
	{"too many", resp("HTTP/1.1 200 OK", "A: 1", "B: 1"), Limits{MaxHeaders: 1}, ErrTooManyHeaders},
	{"connection options", resp("HTTP/1.1 200 OK", "Connection: "+options(17)), Limits{}, ErrConnectionOptions},
}

func TestResponseRules(t *testing.T) {
	for _, tc := range responseRuleCases {
		t.Run(tc.name, func(t *testing.T) {
			var r Response
			err := r.Parse([]byte(tc.in), tc.lim, []byte("GET"))
			if err != tc.want {
				t.Fatalf("Parse(%q) = %v, want %v", tc.in, err, tc.want)
			}
			checkPrefixes(t, tc.in, err, func(b []byte) error { return r.Parse(b, tc.lim, []byte("GET")) })
		})
	}
}

func TestResponseHostAndExpectNotRequired(t *testing.T) {
	var r Response
	in := resp("HTTP/1.1 200 OK", "Host: a", "Host: b", "Expect: x", "Content-Length: 0")
	if err := r.Parse([]byte(in), Limits{}, []byte("GET")); err != nil {
		t.Fatal(err)
	}
	if v, ok := r.Header("content-length"); !ok || string(v) != "0" || !r.HeaderHas("host", "b") {
		t.Fatal("lookup")
	}
}
