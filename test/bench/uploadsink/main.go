// Command uploadsink is the upload benchmark's backend (test/bench/upload.sh):
// an HTTP/1.1 server that reads each request's Content-Length body to the
// end, in reads of at most -read bytes from its socket, before it answers
// "200 ok", as an application that takes an upload does. Bench use only: it
// understands Content-Length bodies and nothing else of HTTP.
package main

import (
	"bufio"
	"bytes"
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
	if *read < 512 {
		fmt.Fprintln(os.Stderr, "uploadsink: -read must be at least 512")
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
		go serve(c, *read)
	}
}

// serve answers every request on c once its body has been read.
func serve(c net.Conn, read int) {
	defer c.Close()
	br := bufio.NewReaderSize(c, read)
	buf := make([]byte, read)
	for {
		n := 0
		for {
			line, err := br.ReadSlice('\n')
			if err != nil {
				return // EOF, or a head line longer than a read: not a bench request
			}
			if len(bytes.TrimRight(line, "\r\n")) == 0 {
				break
			}
			if k, v, ok := bytes.Cut(line, []byte(":")); ok && bytes.EqualFold(bytes.TrimSpace(k), []byte("content-length")) {
				if n, err = strconv.Atoi(string(bytes.TrimSpace(v))); err != nil || n < 0 {
					return
				}
			}
		}
		for n > 0 {
			k, err := br.Read(buf[:min(n, len(buf))])
			if err != nil {
				return
			}
			n -= k
		}
		if _, err := io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"); err != nil {
			return
		}
	}
}
