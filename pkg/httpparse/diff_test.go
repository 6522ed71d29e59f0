package httpparse

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httputil"
	"net/textproto"
	"strings"
	"testing"
)

// laxerRequest lists the rules where net/http's ReadRequest accepts what we
// reject on purpose (each is documented in docs/http.md). A rejection under
// any other rule must be a rejection by net/http too.
var laxerRequest = map[*Error]string{
	ErrTEWithCL:           "net/http drops Content-Length and uses chunked",
	ErrTEHTTP10:           "net/http ignores Transfer-Encoding on HTTP/1.0",
	ErrMissingHost:        "ReadRequest leaves the check to the server",
	ErrBareLF:             "textproto accepts LF line endings",
	ErrObsFold:            "textproto unfolds continuation lines",
	ErrBadHost:            "ReadRequest does not validate Host",
	ErrExpectUnsupported:  "ReadRequest ignores Expect",
	ErrVersionUnsupported: "net/http accepts any HTTP/d.d",
	ErrBadTarget:          "url.ParseRequestURI is laxer (fragment, non-ASCII, query escapes, forms)",
	ErrRequestLineTooLong: "ReadRequest has no limits",
	ErrHeaderTooBig:       "ReadRequest has no limits",
	ErrTooManyHeaders:     "ReadRequest has no limits",
	ErrBadHeaderName:      "textproto accepts field names containing spaces",
	ErrSpaceBeforeColon:   "textproto accepts (and keeps) whitespace before the colon",
	ErrConnectionOptions:  "net/http does not bound Connection options",
}

// laxerResponse is the same for http.ReadResponse.
var laxerResponse = map[*Error]string{
	ErrTEWithCL:           "net/http drops Content-Length and uses chunked",
	ErrTEHTTP10:           "net/http ignores Transfer-Encoding on HTTP/1.0",
	ErrBareLF:             "textproto accepts LF line endings",
	ErrObsFold:            "textproto unfolds continuation lines",
	ErrVersionUnsupported: "net/http accepts any HTTP/d.d",
	ErrStatusLineTooLong:  "ReadResponse has no limits",
	ErrHeaderTooBig:       "ReadResponse has no limits",
	ErrTooManyHeaders:     "ReadResponse has no limits",
	ErrBadHeaderName:      "textproto accepts field names containing spaces",
	ErrSpaceBeforeColon:   "textproto accepts (and keeps) whitespace before the colon",
	ErrBadStatusCode:      "net/http accepts any 3 digits, e.g. 099",
	ErrBadStatusLine:      "net/http does not check the reason phrase",
	ErrConnectionOptions:  "net/http does not bound Connection options",
}

// diffRequest compares our verdict on in with http.ReadRequest's. It returns
// a description of a disagreement, or "".
func diffRequest(in []byte) string { return diffRequestLim(in, Limits{}) }

func diffRequestLim(in []byte, lim Limits) string {
	var r Request
	err := r.Parse(in, lim)
	if err == ErrNeedMore {
		return ""
	}
	hr, herr := http.ReadRequest(bufio.NewReaderSize(bytes.NewReader(in), len(in)+16))
	if err != nil {
		var pe *Error
		if !errors.As(err, &pe) {
			return fmt.Sprintf("non-rule error %v", err)
		}
		if herr == nil && laxerRequest[pe] == "" {
			return fmt.Sprintf("we reject (%s), net/http accepts", pe.Rule)
		}
		return ""
	}
	if herr != nil {
		return fmt.Sprintf("we accept, net/http rejects: %v", herr)
	}
	var b strings.Builder
	if hr.Method != string(r.Method) || hr.RequestURI != string(r.Target) {
		fmt.Fprintf(&b, "method/target %q %q vs %q %q; ", r.Method, r.Target, hr.Method, hr.RequestURI)
	}
	if hr.ProtoMinor != r.Minor {
		fmt.Fprintf(&b, "minor %d vs %d; ", r.Minor, hr.ProtoMinor)
	}
	switch r.BodyMode() {
	case BodyChunked:
		if len(hr.TransferEncoding) != 1 || hr.TransferEncoding[0] != "chunked" || hr.ContentLength != -1 {
			fmt.Fprintf(&b, "chunked vs TE %q CL %d; ", hr.TransferEncoding, hr.ContentLength)
		}
	case BodyLength:
		if hr.ContentLength != r.ContentLength || len(hr.TransferEncoding) != 0 {
			fmt.Fprintf(&b, "length %d vs CL %d TE %q; ", r.ContentLength, hr.ContentLength, hr.TransferEncoding)
		}
	case BodyNone:
		if hr.ContentLength != 0 || len(hr.TransferEncoding) != 0 {
			fmt.Fprintf(&b, "no body vs CL %d TE %q; ", hr.ContentLength, hr.TransferEncoding)
		}
	}
	if hr.Close != r.Close {
		fmt.Fprintf(&b, "close %v vs %v; ", r.Close, hr.Close)
	}
	if hr.Host != string(r.Host) {
		fmt.Fprintf(&b, "host %q vs %q; ", r.Host, hr.Host)
	}
	return b.String()
}

// diffResponse compares our verdict with http.ReadResponse's for a response
// to method.
func diffResponse(in []byte, method string) string {
	var r Response
	err := r.Parse(in, Limits{}, []byte(method))
	if err == ErrNeedMore {
		return ""
	}
	hreq := &http.Request{Method: method}
	hr, herr := http.ReadResponse(bufio.NewReaderSize(bytes.NewReader(in), len(in)+16), hreq)
	if err != nil {
		var pe *Error
		if !errors.As(err, &pe) {
			return fmt.Sprintf("non-rule error %v", err)
		}
		if herr == nil && laxerResponse[pe] == "" && !((pe == ErrNUL || pe == ErrBareCR) && badReason(in)) {
			return fmt.Sprintf("we reject (%s), net/http accepts", pe.Rule)
		}
		return ""
	}
	if herr != nil {
		return fmt.Sprintf("we accept, net/http rejects: %v", herr)
	}
	var b strings.Builder
	if hr.StatusCode != r.Status || hr.ProtoMinor != r.Minor {
		fmt.Fprintf(&b, "status %d/%d vs %d/%d; ", r.Status, r.Minor, hr.StatusCode, hr.ProtoMinor)
	}
	switch r.BodyMode() {
	case BodyNone:
		if method == "CONNECT" && r.Status < 300 {
			// RFC 9112 6.3: a 2xx to CONNECT turns the connection into a
			// tunnel right after the head; net/http's ReadResponse
			// presents the tunnel bytes as a close-delimited body.
			break
		}
		// net/http reports the declared length for HEAD; what matters is
		// that it reads no body.
		n, _ := io.Copy(io.Discard, hr.Body)
		if n != 0 {
			fmt.Fprintf(&b, "no body vs %d body bytes; ", n)
		}
	case BodyChunked:
		if len(hr.TransferEncoding) != 1 || hr.TransferEncoding[0] != "chunked" {
			fmt.Fprintf(&b, "chunked vs TE %q; ", hr.TransferEncoding)
		}
	case BodyLength:
		if hr.ContentLength != r.ContentLength || len(hr.TransferEncoding) != 0 {
			fmt.Fprintf(&b, "length %d vs CL %d TE %q; ", r.ContentLength, hr.ContentLength, hr.TransferEncoding)
		}
	case BodyClose:
		if hr.ContentLength != -1 || len(hr.TransferEncoding) != 0 || !hr.Close {
			fmt.Fprintf(&b, "close-delimited vs CL %d TE %q close %v; ", hr.ContentLength, hr.TransferEncoding, hr.Close)
		}
	}
	if r.BodyMode() != BodyClose && r.BodyMode() != BodyNone && hr.Close != r.Close {
		fmt.Fprintf(&b, "close %v vs %v; ", r.Close, hr.Close)
	}
	return b.String()
}

// badReason reports whether the status line holds a NUL or a CR before its
// CRLF: net/http does not look at the reason phrase.
func badReason(in []byte) bool {
	line, _, _ := bytes.Cut(in, []byte("\r\n"))
	return bytes.IndexByte(line, 0) >= 0 || bytes.IndexByte(line, '\r') >= 0
}

// diffChunked compares our decoder with net/http's chunked reader (via
// httputil.NewChunkedReader) plus textproto for the trailer section.
func diffChunked(in []byte) string {
	body, trailers, rest, err := decodeAll(in, 1<<30, Limits{})
	if err == ErrNeedMore {
		return ""
	}
	br := bufio.NewReaderSize(bytes.NewReader(in), len(in)+16)
	hbody, herr := io.ReadAll(httputil.NewChunkedReader(br))
	var htr textproto.MIMEHeader
	if herr == nil {
		htr, herr = textproto.NewReader(br).ReadMIMEHeader()
	}
	if err != nil {
		// net/http accepts BWS and the like in places we do not; a
		// rejection by us is always allowed, but it must be a rule error.
		var pe *Error
		if !errors.As(err, &pe) {
			return fmt.Sprintf("non-rule error %v", err)
		}
		return ""
	}
	if herr != nil {
		return fmt.Sprintf("we accept, net/http rejects: %v", herr)
	}
	if !bytes.Equal(body, hbody) {
		return fmt.Sprintf("body %q vs %q", body, hbody)
	}
	n := 0
	for _, vs := range htr {
		n += len(vs)
	}
	if n != len(trailers) {
		return fmt.Sprintf("trailers %q vs %q", trailers, htr)
	}
	hrest, _ := io.ReadAll(br)
	if !bytes.Equal(hrest, rest) {
		return fmt.Sprintf("rest %q vs %q", rest, hrest)
	}
	return ""
}

// Generated inputs: valid building blocks mixed with the mutations each rule
// is about.
var (
	genMethods = []string{"GET", "POST", "HEAD", "PUT", "DELETE", "PROPFIND", "get", "OPTIONS", "CONNECT", "G T", "GE(T", ""}
	genTargets = []string{"/", "/a/b?c=d", "/%41", "//x", "/a|b", "http://h.example/x", "https://h:443", "http://[::1]:80/",
		"/<>", "/[x]", "/a?%41%42", "http://h:/", "http://a!b/", "HTTP://H.EXAMPLE",
		"*", "h.example:443", "/%zz", "http://h:123456/", "http://[fe80::1%25eth0]/", "/?q=%zz", "/a#f", "/\xc3\xa9", "ftp://x/", "http://u@h/", "a", "/\x7f", "/a\tb", "http://h:x/"}
	genVersions = []string{"HTTP/1.1", "HTTP/1.0", "HTTP/1.1", "HTTP/1.2", "HTTP/2.0", "HTTP/0.9", "http/1.1", "HTTP/1.1 ", "HTTP/11", "HTTP/1.1\r", ""}
	genFields   = []string{
		"Content-Length: 5", "Content-Length: 5", "Content-Length: 0", "Content-Length: 6", "Content-Length: 5 ", "Content-Length:  5",
		"Transfer-Encoding: chunked", "Transfer-Encoding: CHUNKED", "Connection: close", "Connection: keep-alive",
		"Connection: Upgrade", "Connection: x, close", "Upgrade: websocket", "Expect: 100-continue", "X-A: b", "X-A: b\tc",
		"X-A: \xff", "Content-Type: text/plain; charset=utf-8", "Cookie: a=b; c=d", "Accept: */*", "User-Agent: gen/1.0",
		"Host: h.example", "Host:", "Host: h:8080", "Host: [::1]:80",
		// invalid from here
		"Host: a/b", "host: x y", "Content-Length: +5", "Content-Length: 5, 5", "Content-Length:", "Content-Length: 99999999999999999999",
		"Transfer-Encoding: gzip", "Transfer-Encoding: chunked, gzip", "Transfer-Encoding: identity", "Expect: foo", "X-A: a\x01",
		"X-A : b", "X-A\t: b", "X A: b", " folded", "\tfolded", "X-(: b", "NoColon", ": v", "X: a\rb", "X: \x00",
	}
	genEOL = []string{"\r\n", "\r\n", "\r\n", "\r\n", "\r\n", "\r\n", "\n", "\r"}
)

// biased picks from s, whose first nValid entries are valid: valid 9 times
// in 10.
func biased(rng *rand.Rand, s []string, nValid int) string {
	if rng.IntN(10) != 0 {
		return s[rng.IntN(nValid)]
	}
	return s[rng.IntN(len(s))]
}

func genRequest(rng *rand.Rand) []byte {
	var b bytes.Buffer
	b.WriteString(biased(rng, genMethods, 6) + " " + biased(rng, genTargets, 14) + " " + biased(rng, genVersions, 3) + "\r\n")
	if rng.IntN(10) != 0 {
		b.WriteString("Host: h.example\r\n")
	}
	for n := rng.IntN(6); n > 0; n-- {
		b.WriteString(biased(rng, genFields, 21))
		if rng.IntN(20) == 0 {
			b.WriteString(genEOL[rng.IntN(len(genEOL))])
		} else {
			b.WriteString("\r\n")
		}
	}
	b.WriteString("\r\n")
	return b.Bytes()
}

var (
	genStatus = []string{"HTTP/1.1 200 OK", "HTTP/1.0 200 OK", "HTTP/1.1 204 No Content", "HTTP/1.1 304 Not Modified",
		"HTTP/1.1 100 Continue", "HTTP/1.1 101 Switching Protocols", "HTTP/1.1 404", "HTTP/1.1 500 ", "HTTP/1.1 599 \xffX", "HTTP/1.1 20 OK",
		"HTTP/1.1 2000 OK", "HTTP/2.0 200 OK", "HTTP/1.1 099 X", "HTTP/1.1 200 O\x01K", "HTTP/1.1 abc OK", "HTTP/1.1"}
	genRespMethods = []string{"GET", "HEAD", "POST", "CONNECT"}
)

func genResponse(rng *rand.Rand) ([]byte, string) {
	pick := func(s []string) string { return s[rng.IntN(len(s))] }
	var b bytes.Buffer
	b.WriteString(biased(rng, genStatus, 9) + "\r\n")
	for n := rng.IntN(5); n > 0; n-- {
		f := biased(rng, genFields, 21)
		if strings.HasPrefix(strings.ToLower(f), "host") || strings.HasPrefix(f, "Expect") {
			continue
		}
		b.WriteString(f)
		if rng.IntN(20) == 0 {
			b.WriteString(pick(genEOL))
		} else {
			b.WriteString("\r\n")
		}
	}
	b.WriteString("\r\n")
	return b.Bytes(), pick(genRespMethods)
}

var genChunkLines = []string{"5", "3", "0", "A", "a", "0000000000000003", "00000000000000003", "5;x", "5;x=y", "5;x=\"a b\"", "5 ", " 5",
	"5;", "5; x", "5 ;x", "-5", "0x5", "ffffffffffffffff", "8000000000000000", "7fffffffffffffff", "", "g"}

func genChunked(rng *rand.Rand) []byte {
	var b bytes.Buffer
	for n := rng.IntN(4); n >= 0; n-- {
		line := genChunkLines[rng.IntN(len(genChunkLines))]
		b.WriteString(line)
		b.WriteString(genEOL[rng.IntN(len(genEOL))])
		size, err := parseChunkLine([]byte(strings.TrimSpace(line)))
		if err != nil || size > 64 {
			size = int64(rng.IntN(6))
		}
		if size == 0 {
			if rng.IntN(2) == 0 {
				b.WriteString("X-T: 1\r\n")
			}
			b.WriteString("\r\n")
			return b.Bytes()
		}
		b.Write(bytes.Repeat([]byte("d"), int(size)+rng.IntN(2)))
		b.WriteString(genEOL[rng.IntN(len(genEOL))])
	}
	b.WriteString("0\r\n\r\n")
	return b.Bytes()
}

// report fails t once per distinct kind of disagreement (the text before
// the first ':' or ';'), with the first example.
func report(t *testing.T, d, example string) {
	t.Helper()
	k := d
	if i := strings.IndexAny(k, ":;"); i > 0 {
		k = k[:i]
	}
	if reported[t.Name()+k] {
		return
	}
	reported[t.Name()+k] = true
	t.Errorf("%s: %s", example, d)
}

var reported = map[string]bool{}

func TestDifferentialRequests(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	accepted, rejected := 0, 0
	for i := 0; i < 20000; i++ {
		in := genRequest(rng)
		if d := diffRequest(in); d != "" {
			report(t, d, fmt.Sprintf("%q", in))
		}
		var r Request
		if r.Parse(in, Limits{}) == nil {
			accepted++
		} else {
			rejected++
		}
	}
	if accepted < 2000 || rejected < 2000 {
		t.Fatalf("generator is unbalanced: %d accepted, %d rejected", accepted, rejected)
	}
}

func TestDifferentialResponses(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	accepted := 0
	for i := 0; i < 20000; i++ {
		in, m := genResponse(rng)
		if d := diffResponse(in, m); d != "" {
			report(t, d, fmt.Sprintf("%s %q", m, in))
		}
		var r Response
		if r.Parse(in, Limits{}, []byte(m)) == nil {
			accepted++
		}
	}
	if accepted < 500 {
		t.Fatalf("generator is unbalanced: %d accepted", accepted)
	}
}

func TestDifferentialChunked(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	accepted := 0
	for i := 0; i < 20000; i++ {
		in := genChunked(rng)
		if d := diffChunked(in); d != "" {
			report(t, d, fmt.Sprintf("%q", in))
		}
		if _, _, _, err := decodeAll(in, 1<<30, Limits{}); err == nil {
			accepted++
		}
	}
	if accepted < 500 {
		t.Fatalf("generator is unbalanced: %d accepted", accepted)
	}
}
