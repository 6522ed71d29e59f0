//go:build !race

// Allocation tests (testing.AllocsPerRun). Their counts are meaningless
// under -race (the detector allocates, sync.Pool drops items), so this file
// is left out of the race run and `make test-alloc` runs it without -race.
// Every test here has "Alloc" in its name: that pass selects them by it.

package httpparse

import "testing"

func TestZeroAllocs(t *testing.T) {
	for _, bc := range benchRequests {
		buf := []byte(bc.in)
		var r Request
		if n := testing.AllocsPerRun(100, func() {
			if err := r.Parse(buf, Limits{}); err != nil {
				t.Fatal(err)
			}
			if _, ok := r.Header("cookie"); !ok && bc.name == "BrowserGET" {
				t.Fatal("cookie missing")
			}
		}); n != 0 {
			t.Errorf("Request.Parse %s: %v allocs/op", bc.name, n)
		}
	}
	// Rejections do not allocate either.
	bad := []byte(req("POST / HTTP/1.1", "Host: a", "Transfer-Encoding: chunked", "Content-Length: 1"))
	var r Request
	if n := testing.AllocsPerRun(100, func() { _ = r.Parse(bad, Limits{}) }); n != 0 {
		t.Errorf("rejecting Parse: %v allocs/op", n)
	}
	respBuf := []byte(resp("HTTP/1.1 200 OK", "Content-Length: 3", "X: y"))
	var rs Response
	if n := testing.AllocsPerRun(100, func() {
		if err := rs.Parse(respBuf, Limits{}, []byte("GET")); err != nil {
			t.Fatal(err)
		}
	}); n != 0 {
		t.Errorf("Response.Parse: %v allocs/op", n)
	}
	interim := []byte("HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n" + string(respBuf))
	if n := testing.AllocsPerRun(100, func() {
		var seen Interims
		if err := rs.ParseUpstream(interim, []byte("GET"), &seen); err != nil || !rs.Interim() {
			t.Fatal(err)
		}
		if err := rs.ParseUpstream(interim[rs.HeadLen:], []byte("GET"), &seen); err != nil || !rs.Reusable([]byte("GET")) {
			t.Fatal(err)
		}
	}); n != 0 {
		t.Errorf("Response.ParseUpstream: %v allocs/op", n)
	}
	enc := []byte("5;x=y\r\nhello\r\n3\r\nabc\r\n0\r\nX-T: 1\r\n\r\n")
	var d ChunkedDecoder
	if n := testing.AllocsPerRun(100, func() {
		d.Reset(Limits{})
		src := enc
		for !d.Done() {
			k, _, err := d.Decode(src)
			if err != nil {
				t.Fatal(err)
			}
			src = src[k:]
		}
	}); n != 0 {
		t.Errorf("ChunkedDecoder: %v allocs/op", n)
	}
}
