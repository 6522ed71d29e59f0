package h2proxy

import (
	"bytes"
	"errors"
	"io"
	"net"
	"os"
	"testing"
	"time"
)

// tcpPair returns the two ends of a loopback TCP connection.
func tcpPair(t *testing.T) (client, server net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	acc := make(chan net.Conn, 1)
	go func() {
		c, _ := ln.Accept()
		acc <- c
	}()
	client, err = net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	select {
	case server = <-acc:
	case <-time.After(10 * time.Second):
		t.Fatal("accept did not return")
	}
	if server == nil {
		t.Fatal("accept failed")
	}
	t.Cleanup(func() { _ = client.Close(); _ = server.Close() })
	return client, server
}

// TestReadBufFrames: reads of the sizes a frame reader makes (a 9-byte
// header, then its payload) and larger ones return the peer's bytes in
// order, on a TCP connection (buffered reads) and on a pipe (no
// descriptor: direct reads); then EOF.
func TestReadBufFrames(t *testing.T) {
	tests := []struct {
		name string
		pair func(t *testing.T) (net.Conn, net.Conn)
	}{
		{"tcp", tcpPair},
		{"pipe", func(*testing.T) (net.Conn, net.Conn) { return net.Pipe() }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			peer, c := tt.pair(t)
			var want bytes.Buffer
			for i, n := range []int{9, 30, 9, 1, readBufSize + 100, 9, 700, 3 * readBufSize} {
				want.Write(pattern(i, n))
			}
			go func() {
				_, _ = peer.Write(want.Bytes())
				_ = peer.Close()
			}()
			var rb readBuf
			rb.init(c, c)
			if tt.name == "tcp" && rb.rc == nil {
				t.Fatal("a TCP connection must be read through its descriptor")
			}
			var got bytes.Buffer
			for _, n := range []int{9, 30, 9, 1, readBufSize + 100, 9, 700, 5, 1 << 20} {
				p := make([]byte, n)
				if n == 1<<20 { // whatever is left
					rest, err := io.ReadAll(readerFunc(rb.read))
					if err != nil {
						t.Fatalf("read rest: %v", err)
					}
					got.Write(rest)
					break
				}
				if _, err := io.ReadFull(readerFunc(rb.read), p); err != nil {
					t.Fatalf("read %d: %v", n, err)
				}
				got.Write(p)
			}
			if !bytes.Equal(got.Bytes(), want.Bytes()) {
				t.Fatalf("got %d bytes, want %d (or out of order)", got.Len(), want.Len())
			}
			if rb.buf != nil {
				t.Fatal("a drained reader still holds its buffer")
			}
		})
	}
}

type readerFunc func([]byte) (int, error)

func (f readerFunc) Read(p []byte) (int, error) { return f(p) }

// TestReadBufErrors: a read past the deadline, and one on a closed
// connection, fail as net.Conn reads do (a timeout, net.ErrClosed) and
// leave no buffer held.
func TestReadBufErrors(t *testing.T) {
	_, c := tcpPair(t)
	var rb readBuf
	rb.init(c, c)
	if err := c.SetReadDeadline(time.Now().Add(time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	_, err := rb.read(make([]byte, 9))
	var ne net.Error
	if !errors.As(err, &ne) || !ne.Timeout() || !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read past deadline: %v, want a timeout", err)
	}
	if rb.buf != nil {
		t.Fatal("buffer held after a timeout")
	}
	_ = c.Close()
	if _, err := rb.read(make([]byte, 9)); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("read on closed connection: %v, want net.ErrClosed", err)
	}
}
