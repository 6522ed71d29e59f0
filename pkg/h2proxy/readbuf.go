package h2proxy

import (
	"io"
	"net"
	"os"
	"sync"
	"syscall"
)

// readBuf batches the reads of a client connection. The HTTP/2 server
// reads its frames straight from the connection: a 9-byte frame header,
// then the payload, two read(2)s per frame and so two per request (a
// HEADERS frame) under h2load. readBuf reads what the socket holds into a
// buffer and serves the frame reads from it, so the streams that arrived
// together cost one read(2).
//
// The buffer is taken from a pool only for the read(2) itself and goes
// back once the frames in it are consumed or the read would block (the
// wait for readable data uses the descriptor's poller, holding no
// buffer): an idle connection holds none. Reads at least as large as the
// buffer go straight to the connection. Only the codec's reading
// goroutine calls read.
type readBuf struct {
	rc   syscall.RawConn // nil: read the connection directly
	conn net.Conn
	buf  *[]byte // pooled; nil when empty
	r, w int

	// Results of readFD, a method value bound once (no allocation per
	// read).
	fn   func(fd uintptr) bool
	n    int
	rerr error
}

// readBufSize holds the frames of many streams (a HEADERS frame of a
// request whose fields are in the HPACK table is a few dozen bytes).
const readBufSize = 8 << 10

var readBufs = sync.Pool{New: func() any { b := make([]byte, readBufSize); return &b }}

// init prepares reading c (the accepted connection; conn is what Read
// falls back to, the same connection).
func (b *readBuf) init(c, conn net.Conn) {
	b.conn = conn
	if sc, ok := c.(syscall.Conn); ok {
		if rc, err := sc.SyscallConn(); err == nil {
			b.rc = rc
			b.fn = b.readFD
		}
	}
}

// read fills p from the buffer, or from the connection when the buffer is
// empty.
func (b *readBuf) read(p []byte) (int, error) {
	if b.r < b.w {
		n := copy(p, (*b.buf)[b.r:b.w])
		b.r += n
		if b.r == b.w {
			b.release()
		}
		return n, nil
	}
	if b.rc == nil || len(p) >= readBufSize {
		return b.conn.Read(p)
	}
	b.n, b.rerr = 0, nil
	if err := b.rc.Read(b.fn); err != nil { // deadline or closed
		b.release()
		return 0, &net.OpError{Op: "read", Net: "tcp", Source: b.conn.LocalAddr(), Addr: b.conn.RemoteAddr(), Err: err}
	}
	if b.rerr != nil {
		b.release()
		return 0, &net.OpError{Op: "read", Net: "tcp", Source: b.conn.LocalAddr(), Addr: b.conn.RemoteAddr(), Err: os.NewSyscallError("read", b.rerr)}
	}
	if b.n == 0 {
		b.release()
		return 0, io.EOF
	}
	b.r, b.w = 0, b.n
	return b.read(p)
}

// readFD is the RawConn.Read callback: one non-blocking read(2) into the
// pooled buffer; false (wait until readable) when there is nothing yet,
// the buffer going back to the pool meanwhile.
func (b *readBuf) readFD(fd uintptr) bool {
	if b.buf == nil {
		b.buf = readBufs.Get().(*[]byte)
	}
	for {
		n, err := syscall.Read(int(fd), *b.buf)
		switch {
		case err == syscall.EINTR:
			continue
		case err == syscall.EAGAIN:
			b.release()
			return false
		case err != nil:
			b.rerr = err
		default:
			b.n = n
		}
		return true
	}
}

// release returns the buffer to the pool.
func (b *readBuf) release() {
	if b.buf != nil {
		readBufs.Put(b.buf)
		b.buf = nil
	}
	b.r, b.w = 0, 0
}
