// Command uploadsink is the upload benchmark's backend (test/bench/upload.sh):
// an HTTP/1.1 server that reads each request's Content-Length body to the
// end, in reads of at most -read bytes from its socket, before it answers
// "200 ok", as an application that takes an upload does. Bench use only: it
// understands Content-Length bodies and nothing else of HTTP.
package main

import (
	"bufio"
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
)

func main() {
	addr := flag.String("listen", "127.0.0.1:0", "address to listen on")
	read := flag.Int("read", 4096, "largest read from a connection, bytes")
	flag.Parse()
	if *read < minRead {
		fmt.Fprintf(os.Stderr, "uploadsink: -read must be at least %d\n", minRead)
		os.Exit(2)
	}
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		fmt.Fprintln(os.Stderr, "uploadsink:", err)
		os.Exit(1)
	}
	fmt.Println(ln.Addr()) // the script reads the port from here
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		go func() {
			defer c.Close()
			serve(c, *read)
		}()
	}
}

// minRead is the smallest -read: also the longest head line taken.
const minRead = 512

// maxBody bounds a Content-Length (1 TiB): a bench body, not a number
// that overflows the countdown.
const maxBody = 1 << 40

// Errors of readHead: the connection is then closed without an answer.
var (
	errLine   = errors.New("head line longer than a read, or no end of line")
	errLength = errors.New("bad Content-Length")
)

// readHead reads one request head from br and returns its Content-Length
// (0 without one; the last one counts).
func readHead(br *bufio.Reader) (int64, error) {
	var n int64
	for {
		line, err := br.ReadSlice('\n')
		if err != nil {
			if errors.Is(err, bufio.ErrBufferFull) {
				return 0, errLine
			}
			return 0, err
		}
		if len(bytes.TrimRight(line, "\r\n")) == 0 {
			return n, nil
		}
		k, v, ok := bytes.Cut(line, []byte(":"))
		if !ok || !bytes.EqualFold(bytes.TrimSpace(k), []byte("content-length")) {
			continue
		}
		n, err = strconv.ParseInt(string(bytes.TrimSpace(v)), 10, 64)
		if err != nil || n < 0 || n > maxBody {
			return 0, errLength
		}
	}
}

// serve answers every request on rw once its body has been read, in
// reads of at most read bytes, until rw ends or sends a head it does not
// take.
func serve(rw io.ReadWriter, read int) {
	br := bufio.NewReaderSize(rw, read)
	buf := make([]byte, read)
	for {
		n, err := readHead(br)
		if err != nil {
			return
		}
		for n > 0 {
			k, err := br.Read(buf[:min(n, int64(len(buf)))])
			if err != nil {
				return
			}
			n -= int64(k)
		}
		if _, err := io.WriteString(rw, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"); err != nil {
			return
		}
	}
}
