package main

import (
	"bufio"
	"errors"
	"io"
	"net"
	"strings"
	"testing"
	"time"
)

func TestReadResponse(t *testing.T) {
	for _, tc := range []struct {
		name   string
		in     string
		closes bool
		err    error
		rest   string // what must be left unread
	}{
		{"length", "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhelloNEXT", false, nil, "NEXT"},
		{"close header", "HTTP/1.1 200 OK\r\nconnection: Close\r\nContent-Length: 1\r\n\r\nx", true, nil, ""},
		{"HTTP/1.0 closes", "HTTP/1.0 200 OK\r\nContent-Length: 1\r\n\r\nx", true, nil, ""},
		{"until EOF", "HTTP/1.0 200 OK\r\n\r\nbody to the end", true, nil, ""},
		{"chunked", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3;x=y\r\nabc\r\n0\r\nT: v\r\n\r\nNEXT", false, nil, "NEXT"},
		{"bare LF", "HTTP/1.1 204 No Content\nContent-Length: 0\n\nNEXT", false, nil, "NEXT"},
		{"not 2xx", "HTTP/1.1 429 Too Many Requests\r\n\r\n", false, errNotOK, ""},
		{"short status", "HTTP/1.1 20\r\n\r\n", false, errStatus, ""},
		{"not HTTP", "SSH-2.0-x\r\n\r\n", false, errStatus, ""},
		{"bad length", "HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n", false, errLength, ""},
		{"bad chunk", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", false, errChunk, ""},
		{"truncated body", "HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\nabc", false, io.EOF, ""},
		{"truncated head", "HTTP/1.1 200 OK\r\nContent-Le", false, io.EOF, ""},
		{"long line", "HTTP/1.1 200 OK\r\nX: " + strings.Repeat("a", 70<<10) + "\r\n\r\n", false, errTooLong, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			br := bufio.NewReaderSize(strings.NewReader(tc.in), 64<<10)
			closes, err := readResponse(br)
			if !errors.Is(err, tc.err) {
				t.Fatalf("err = %v, want %v", err, tc.err)
			}
			if err != nil {
				return
			}
			if closes != tc.closes {
				t.Errorf("closes = %v, want %v", closes, tc.closes)
			}
			if rest, _ := io.ReadAll(br); string(rest) != tc.rest {
				t.Errorf("left %q unread, want %q", rest, tc.rest)
			}
		})
	}
}

// TestRunCountsEveryRequest runs the client against a loopback server
// that answers 20 requests and then closes: every answered request is a
// sample, the refused ones are errors, none is synthesised.
func TestRunCountsEveryRequest(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		br := bufio.NewReader(c)
		for i := 0; i < 20; i++ {
			for { // one request head
				l, err := br.ReadString('\n')
				if err != nil {
					c.Close()
					return
				}
				if l == "\r\n" {
					break
				}
			}
			io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
		}
		c.Close()
		ln.Close() // later dials are refused
	}()
	r := run(ln.Addr().String(), []byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n"), false, time.Now().Add(time.Minute), 25, 5*time.Second)
	if len(r.lat) != 20 {
		t.Fatalf("%d samples, want the 20 answered requests (errors %d, first %v)", len(r.lat), r.errs, r.err)
	}
	if r.errs != 5 {
		t.Fatalf("%d errors, want the 5 attempts after the server left", r.errs)
	}
}

func TestQuantile(t *testing.T) {
	s := make([]time.Duration, 1000)
	for i := range s {
		s[i] = time.Duration(i + 1)
	}
	for q, want := range map[float64]time.Duration{0.5: 500, 0.99: 990, 0.999: 999, 1: 1000, 0: 1} {
		if got := quantile(s, q); got != want {
			t.Errorf("quantile(%v) = %d, want %d", q, got, want)
		}
	}
}

func FuzzReadResponse(f *testing.F) {
	f.Add("HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello")
	f.Add("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n")
	f.Add("HTTP/1.0 200 OK\r\n\r\nrest")
	f.Fuzz(func(t *testing.T, in string) {
		br := bufio.NewReaderSize(strings.NewReader(in), 4096)
		readResponse(br) // must not panic or loop
	})
}
