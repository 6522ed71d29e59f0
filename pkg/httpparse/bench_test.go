package httpparse

import (
	"bufio"
	"bytes"
	"net/http"
	"strings"
	"testing"
)

const (
	benchSmallGET = "GET /healthz HTTP/1.1\r\nHost: svc.local\r\n\r\n"

	benchBrowserGET = "GET /api/v1/items?page=2&sort=desc HTTP/1.1\r\n" +
		"Host: www.example.com\r\n" +
		"User-Agent: Mozilla/5.0 (X11; Linux x86_64; rv:128.0) Gecko/20100101 Firefox/128.0\r\n" +
		"Accept: text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8\r\n" +
		"Accept-Language: en-US,en;q=0.5\r\n" +
		"Accept-Encoding: gzip, deflate, br, zstd\r\n" +
		"Referer: https://www.example.com/items\r\n" +
		"Connection: keep-alive\r\n" +
		"Cookie: session=4f9a2c1e8b7d6a5f; theme=dark; _ga=GA1.2.123456789.1700000000\r\n" +
		"Upgrade-Insecure-Requests: 1\r\n" +
		"Sec-Fetch-Dest: document\r\n" +
		"Sec-Fetch-Mode: navigate\r\n" +
		"Sec-Fetch-Site: same-origin\r\n" +
		"\r\n"

	benchPOST = "POST /api/v1/orders HTTP/1.1\r\n" +
		"Host: api.example.com\r\n" +
		"Content-Type: application/json\r\n" +
		"Content-Length: 27\r\n" +
		"Authorization: Bearer eyJhbGciOiJIUzI1NiJ9.e30.abc\r\n" +
		"Accept: */*\r\n" +
		"\r\n" +
		`{"item":"book","count":1}` + "\r\n"
)

var benchRequests = []struct{ name, in string }{
	{"SmallGET", benchSmallGET},
	{"BrowserGET", benchBrowserGET},
	{"POSTWithCL", benchPOST},
}

// BenchmarkRequest parses each request with Request.Parse ("httpparse") and
// with http.ReadRequest over a reused bufio.Reader on a reset bytes.Reader,
// as a server would ("nethttp"). The pairs run back to back so that load on a
// shared machine affects both sides alike.
func BenchmarkRequest(b *testing.B) {
	for _, bc := range benchRequests {
		buf := []byte(bc.in)
		b.Run(bc.name+"/httpparse", func(b *testing.B) {
			var r Request
			b.SetBytes(int64(len(buf)))
			b.ReportAllocs()
			measureCPU(b, func() {
				for b.Loop() {
					if err := r.Parse(buf, Limits{}); err != nil {
						b.Fatal(err)
					}
				}
			})
		})
		b.Run(bc.name+"/nethttp", func(b *testing.B) {
			rd := bytes.NewReader(buf)
			br := bufio.NewReader(rd)
			b.SetBytes(int64(len(buf)))
			b.ReportAllocs()
			measureCPU(b, func() {
				for b.Loop() {
					rd.Reset(buf)
					br.Reset(rd)
					if _, err := http.ReadRequest(br); err != nil {
						b.Fatal(err)
					}
				}
			})
		})
	}
}

// BenchmarkResponse is the same pairing for a typical nginx response head
// against http.ReadResponse.
func BenchmarkResponse(b *testing.B) {
	buf := []byte("HTTP/1.1 200 OK\r\nServer: nginx\r\nDate: Mon, 30 Nov 2026 08:00:00 GMT\r\nContent-Type: text/html\r\nContent-Length: 615\r\nConnection: keep-alive\r\nETag: \"5f3c-267\"\r\n\r\n")
	b.Run("httpparse", func(b *testing.B) {
		var r Response
		method := []byte("GET")
		b.SetBytes(int64(len(buf)))
		b.ReportAllocs()
		measureCPU(b, func() {
			for b.Loop() {
				if err := r.Parse(buf, Limits{}, method); err != nil {
					b.Fatal(err)
				}
			}
		})
	})
	b.Run("nethttp", func(b *testing.B) {
		rd := bytes.NewReader(buf)
		br := bufio.NewReader(rd)
		hreq := &http.Request{Method: "GET"}
		b.SetBytes(int64(len(buf)))
		b.ReportAllocs()
		measureCPU(b, func() {
			for b.Loop() {
				rd.Reset(buf)
				br.Reset(rd)
				if _, err := http.ReadResponse(br, hreq); err != nil {
					b.Fatal(err)
				}
			}
		})
	})
}

func BenchmarkChunkedDecode(b *testing.B) {
	var enc []byte
	chunk := bytes.Repeat([]byte("x"), 4096)
	for i := 0; i < 16; i++ {
		enc = AppendChunkHeader(enc, len(chunk))
		enc = append(enc, chunk...)
		enc = append(enc, "\r\n"...)
	}
	enc = append(enc, LastChunk...)
	var d ChunkedDecoder
	b.SetBytes(int64(len(enc)))
	b.ReportAllocs()
	measureCPU(b, func() {
		for b.Loop() {
			d.Reset(Limits{})
			src := enc
			for !d.Done() {
				n, _, err := d.Decode(src)
				if err != nil {
					b.Fatal(err)
				}
				src = src[n:]
			}
		}
	})
}

// BenchmarkByteByByte is the worst case of a client that sends one byte per
// segment: Parse runs once per byte of the browser-like GET (555 calls per
// op), as a proxy calling Parse after every read would.
func BenchmarkByteByByte(b *testing.B) {
	b.Run("BrowserGET", func(b *testing.B) { benchByteByByte(b, []byte(benchBrowserGET)) })
	// 2 KiB of 6-byte field lines: many lines per byte fed.
	b.Run("ShortLines2KiB", func(b *testing.B) {
		benchByteByByte(b, []byte(req("GET / HTTP/1.1", append([]string{"Host: a"}, strings.Split(strings.Repeat("A: b\n", 90), "\n")[:90]...)...)))
	})
}

func benchByteByByte(b *testing.B, buf []byte) {
	var r Request
	b.ReportAllocs()
	measureCPU(b, func() {
		for b.Loop() {
			for i := 1; i < len(buf); i++ {
				if err := r.Parse(buf[:i], Limits{}); err != ErrNeedMore {
					b.Fatal(err)
				}
			}
			if err := r.Parse(buf, Limits{}); err != nil {
				b.Fatal(err)
			}
		}
	})
}
