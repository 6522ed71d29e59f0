package main

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"net"
	"strings"
	"testing"
)

func TestReadHead(t *testing.T) {
	long := "X-Long: " + strings.Repeat("a", minRead) + "\r\n"
	for _, tc := range []struct {
		name string
		in   string
		want int64
		err  error
	}{
		{"no body", "GET / HTTP/1.1\r\nHost: a\r\n\r\n", 0, nil},
		{"body", "POST / HTTP/1.1\r\nContent-Length: 12\r\n\r\n", 12, nil},
		{"case and spaces", "POST / HTTP/1.1\r\ncOnTeNt-LeNgTh :  7 \r\n\r\n", 7, nil},
		{"bare LF", "POST / HTTP/1.1\nContent-Length: 3\n\n", 3, nil},
		{"last counts", "POST / HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n", 2, nil},
		{"negative", "POST / HTTP/1.1\r\nContent-Length: -1\r\n\r\n", 0, errLength},
		{"not a number", "POST / HTTP/1.1\r\nContent-Length: 1x\r\n\r\n", 0, errLength},
		{"over 1 TiB", "POST / HTTP/1.1\r\nContent-Length: 1099511627777\r\n\r\n", 0, errLength},
		{"overflows int64", "POST / HTTP/1.1\r\nContent-Length: 99999999999999999999\r\n\r\n", 0, errLength},
		{"line longer than a read", "POST / HTTP/1.1\r\n" + long + "\r\n", 0, errLine},
		{"ends mid-head", "POST / HTTP/1.1\r\nContent-Length: 5\r\n", 0, io.EOF},
		{"empty", "", 0, io.EOF},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n, err := readHead(bufio.NewReaderSize(strings.NewReader(tc.in), minRead))
			if !errors.Is(err, tc.err) || n != tc.want {
				t.Fatalf("readHead = %d, %v; want %d, %v", n, err, tc.want, tc.err)
			}
		})
	}
}

// pipeServe runs serve on one end of a pipe and returns the other end and
// a channel closed when serve returned.
func pipeServe() (net.Conn, chan struct{}) {
	client, server := net.Pipe()
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer server.Close()
		serve(server, minRead)
	}()
	return client, done
}

// TestServePipelined sends two uploads and a bodiless request in one
// write: each gets its answer, in order, after its whole body was read
// (the bodies hold what would be a head if they were not skipped).
func TestServePipelined(t *testing.T) {
	client, done := pipeServe()
	body := strings.Repeat("GET /x HTTP/1.1\r\n\r\n", 100) // 1,900 bytes: several reads
	req := "POST / HTTP/1.1\r\nContent-Length: 1900\r\n\r\n" + body +
		"POST / HTTP/1.1\r\nContent-Length: 3\r\n\r\nabc" +
		"GET / HTTP/1.1\r\n\r\n"
	go func() { io.WriteString(client, req) }()
	answer := "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
	got := make([]byte, 3*len(answer))
	if _, err := io.ReadFull(client, got); err != nil {
		t.Fatalf("read answers: %v", err)
	}
	if want := strings.Repeat(answer, 3); string(got) != want {
		t.Fatalf("answers = %q, want %q", got, want)
	}
	client.Close()
	<-done
}

// TestServeAbuse: a peer that vanishes mid-body, one that sends a bad
// length or an endless head line, and one that never reads its answer
// each end serve (it returns; no goroutine is left).
func TestServeAbuse(t *testing.T) {
	for _, tc := range []struct {
		name, in  string
		closeRead bool // close the client before reading the answer
	}{
		{"vanishes mid-body", "POST / HTTP/1.1\r\nContent-Length: 100000\r\n\r\npartial", false},
		{"negative length", "POST / HTTP/1.1\r\nContent-Length: -5\r\n\r\n", false},
		{"endless head line", "POST / HTTP/1.1\r\nX: " + strings.Repeat("b", 4*minRead), false},
		{"never reads the answer", "GET / HTTP/1.1\r\n\r\n", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			client, done := pipeServe()
			wrote := make(chan error, 1)
			go func() { _, err := io.WriteString(client, tc.in); wrote <- err }()
			if tc.closeRead {
				<-wrote // the whole head is taken; serve now writes its answer
			}
			client.Close()
			<-done
		})
	}
}

// FuzzReadHead: any input ends serve without a panic, and a head readHead
// takes has a length within bounds.
func FuzzReadHead(f *testing.F) {
	f.Add([]byte("POST / HTTP/1.1\r\nContent-Length: 12\r\n\r\nhello world!"))
	f.Add([]byte("GET / HTTP/1.1\r\n\r\nGET / HTTP/1.1\r\n\r\n"))
	f.Add([]byte("POST / HTTP/1.1\r\nContent-Length: -1\r\n\r\n"))
	f.Add([]byte("POST / HTTP/1.1\r\nContent-Length: 99999999999999999999\r\n\r\n"))
	f.Fuzz(func(t *testing.T, in []byte) {
		n, err := readHead(bufio.NewReaderSize(bytes.NewReader(in), minRead))
		if err == nil && (n < 0 || n > maxBody) {
			t.Fatalf("readHead took length %d", n)
		}
		var out bytes.Buffer
		serve(struct {
			io.Reader
			io.Writer
		}{bytes.NewReader(in), &out}, minRead)
		if out.Len()%len("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok") != 0 {
			t.Fatalf("partial answer written: %q", out.Bytes())
		}
	})
}
