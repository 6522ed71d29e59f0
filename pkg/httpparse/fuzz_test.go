package httpparse

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

var fuzzMethods = []string{"GET", "HEAD", "POST", "CONNECT"}

// fuzzLimits derives small limits from sel (odd values) so that fuzzing
// reaches the 414/431 paths, or the defaults (even values).
func fuzzLimits(sel uint8) Limits {
	if sel&1 == 0 {
		return Limits{}
	}
	return Limits{MaxRequestLine: 8 + int(sel%64), MaxHeaderBytes: 32 + int(sel)*2, MaxHeaders: 1 + int(sel%8)}
}

func FuzzRequest(f *testing.F) {
	f.Add([]byte(okGET), uint8(0))
	f.Fuzz(func(t *testing.T, data []byte, sel uint8) {
		lim := fuzzLimits(sel)
		var r Request
		err := r.Parse(data, lim)
		if err == nil {
			if r.HeadLen < 4 || r.HeadLen > len(data) || r.HeadLen > lim.norm().MaxHeaderBytes {
				t.Fatalf("HeadLen %d of %d", r.HeadLen, len(data))
			}
			// The head alone parses identically; any shorter prefix is
			// incomplete.
			var r2 Request
			if err := r2.Parse(data[:r.HeadLen], lim); err != nil || r2.HeadLen != r.HeadLen || len(r2.Headers) != len(r.Headers) {
				t.Fatalf("head alone: %v", err)
			}
			if err := r2.Parse(data[:r.HeadLen-1], lim); err != ErrNeedMore {
				t.Fatalf("head minus one byte: %v", err)
			}
			if r.Chunked && r.ContentLength != -1 || r.Minor > 1 || len(r.Headers) > lim.norm().MaxHeaders {
				t.Fatalf("inconsistent facts %+v", r)
			}
		} else if err != ErrNeedMore {
			for _, n := range []int{len(data) / 2, len(data) - 1} {
				if n < 0 {
					continue
				}
				var r2 Request
				if e := r2.Parse(data[:n], lim); e != ErrNeedMore && e != err {
					t.Fatalf("prefix %d: %v, whole: %v", n, e, err)
				}
			}
		}
		if d := diffRequestLim(data, lim); d != "" {
			t.Fatalf("differential: %s", d)
		}
	})
}

func FuzzResponse(f *testing.F) {
	f.Add([]byte("HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"), uint8(0))
	f.Fuzz(func(t *testing.T, data []byte, m uint8) {
		method := fuzzMethods[int(m)%len(fuzzMethods)]
		var r Response
		err := r.Parse(data, Limits{}, []byte(method))
		if err == nil {
			if r.HeadLen > len(data) || r.Status < 100 || r.Status > 999 {
				t.Fatalf("HeadLen %d status %d", r.HeadLen, r.Status)
			}
			if r.BodyMode() == BodyClose && !r.Close {
				t.Fatal("close-delimited without Close")
			}
			var r2 Response
			if err := r2.Parse(data[:r.HeadLen-1], Limits{}, []byte(method)); err != ErrNeedMore {
				t.Fatalf("head minus one byte: %v", err)
			}
		}
		if d := diffResponse(data, method); d != "" {
			t.Fatalf("differential (%s): %s", method, d)
		}
	})
}

func FuzzChunked(f *testing.F) {
	f.Add([]byte("5\r\nhello\r\n0\r\n\r\n"), uint8(1))
	f.Fuzz(func(t *testing.T, data []byte, step uint8) {
		body, tr, rest, err := decodeAll(data, 1<<30, Limits{})
		body2, tr2, rest2, err2 := decodeAll(data, 1+int(step)%32, Limits{})
		if err != err2 || !bytes.Equal(body, body2) || !bytes.Equal(rest, rest2) || strings.Join(tr, "\n") != strings.Join(tr2, "\n") {
			t.Fatalf("split feeding differs: %v/%v body %q/%q rest %q/%q", err, err2, body, body2, rest, rest2)
		}
		if d := diffChunked(data); d != "" {
			t.Fatalf("differential: %s", d)
		}
	})
}

// TestWriteSeedCorpus regenerates testdata/fuzz from the rule tables when
// HTTPPARSE_WRITE_CORPUS=1; otherwise it checks the corpus exists.
func TestWriteSeedCorpus(t *testing.T) {
	write := os.Getenv("HTTPPARSE_WRITE_CORPUS") == "1"
	type seed struct {
		target string
		args   []string
	}
	var seeds []seed
	q := func(s string) string { return fmt.Sprintf("[]byte(%q)", s) }
	for _, tc := range requestRuleCases {
		if len(tc.in) < 4096 {
			sel := 0
			if tc.lim != (Limits{}) {
				sel = 1 // small limits
			}
			seeds = append(seeds, seed{"FuzzRequest", []string{q(tc.in), fmt.Sprintf("byte(%d)", sel)}})
		}
	}
	for _, in := range []string{okGET, benchSmallGET, benchBrowserGET, benchPOST,
		req("GET http://b.example:81/x?y HTTP/1.1", "Host: other"), req("CONNECT a:443 HTTP/1.1", "Host: a:443"),
		req("PUT / HTTP/1.1", "Host: a", "Expect: 100-continue", "Transfer-Encoding: chunked"),
		req("GET / HTTP/1.0", "Connection: keep-alive"), req("OPTIONS * HTTP/1.1", "Host: a")} {
		seeds = append(seeds, seed{"FuzzRequest", []string{q(in), "byte(0)"}})
	}
	for i, tc := range responseRuleCases {
		if len(tc.in) < 4096 && tc.lim == (Limits{}) {
			seeds = append(seeds, seed{"FuzzResponse", []string{q(tc.in), fmt.Sprintf("byte(%d)", i%4)}})
		}
	}
	for i, in := range []string{resp("HTTP/1.1 200 OK", "Content-Length: 3"), resp("HTTP/1.1 200 OK", "Transfer-Encoding: chunked"),
		resp("HTTP/1.0 200 OK"), resp("HTTP/1.1 304 Not Modified", "Content-Length: 9"), resp("HTTP/1.1 101 Switching Protocols", "Upgrade: websocket"),
		resp("HTTP/1.1 204 No Content"), resp("HTTP/1.1 100 Continue"), resp("HTTP/1.1 200 OK", "Connection: close")} {
		seeds = append(seeds, seed{"FuzzResponse", []string{q(in), fmt.Sprintf("byte(%d)", i%4)}})
	}
	for i, tc := range chunkRuleCases {
		if len(tc.in) < 4096 {
			seeds = append(seeds, seed{"FuzzChunked", []string{q(tc.in), fmt.Sprintf("byte(%d)", i%7)}})
		}
	}
	for i, in := range []string{"5\r\nhello\r\n0\r\n\r\n", "3;a=b\r\nabc\r\n0\r\nX: y\r\n\r\nNEXT", "A\r\n0123456789\r\n0\r\n\r\n",
		"1;a=\"x\\\"y\"\r\nz\r\n0\r\n\r\n", "0\r\n\r\n"} {
		seeds = append(seeds, seed{"FuzzChunked", []string{q(in), fmt.Sprintf("byte(%d)", i)}})
	}
	counts := map[string]int{}
	for _, s := range seeds {
		dir := filepath.Join("testdata", "fuzz", s.target)
		i := counts[s.target]
		counts[s.target]++
		if !write {
			continue
		}
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		body := "go test fuzz v1\n" + strings.Join(s.args, "\n") + "\n"
		if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("seed-%03d", i)), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for target, n := range counts {
		files, _ := filepath.Glob(filepath.Join("testdata", "fuzz", target, "seed-*"))
		if len(files) < n {
			t.Errorf("%s: %d committed seeds, want %d (run with HTTPPARSE_WRITE_CORPUS=1)", target, len(files), n)
		}
	}
}
