package proxy

import (
	"net"
	"os"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Socket I/O on the request path goes through syscall.RawConn with raw
// (runtime-unannounced) read and write system calls. The sockets are
// non-blocking, so these calls never sleep in the kernel; skipping the
// runtime's entersyscall/exitsyscall keeps the scheduler's monitor thread
// from taking the P away during a loopback write (which, on a busy or
// pinned CPU, cost a thread hand-off and a futex wake per request) and lets
// it back off instead of polling every 20 µs. Waiting for readiness and
// deadlines still go through Go's netpoller (RawConn.Read/Write).

// sysRead is read(2) on a non-blocking descriptor, restarted on EINTR.
func sysRead(fd uintptr, b []byte) (int, unix.Errno) {
	for {
		n, _, e := unix.RawSyscall(unix.SYS_READ, fd, uintptr(unsafePtr(b)), uintptr(len(b)))
		if e == unix.EINTR {
			continue
		}
		if e != 0 {
			return 0, e
		}
		return int(n), 0
	}
}

// sockWriter writes a whole buffer to a socket from inside the runtime's
// poller loop. It is embedded in a pooled conn so that a write does not
// allocate.
type sockWriter struct {
	b   []byte
	n   int
	err unix.Errno
	fn  func(uintptr) bool
	try func(uintptr)
}

func (w *sockWriter) init() {
	w.fn = w.write
	w.try = func(fd uintptr) { w.write(fd) }
}

func (w *sockWriter) write(fd uintptr) bool {
	for w.n < len(w.b) {
		p := w.b[w.n:]
		n, _, e := unix.RawSyscall(unix.SYS_WRITE, fd, uintptr(unsafePtr(p)), uintptr(len(p)))
		switch e {
		case 0:
			w.n += int(n)
		case unix.EINTR:
		case unix.EAGAIN:
			return false // wait until writable (or the deadline)
		default:
			w.err = e
			return true
		}
	}
	return true
}

// writeAll writes b to nc, through raw when the connection has one. Errors
// have the shape of net.Conn.Write's.
func (w *sockWriter) writeAll(nc net.Conn, raw syscall.RawConn, b []byte) (int, error) {
	if raw == nil {
		return nc.Write(b)
	}
	w.b, w.n, w.err = b, 0, 0
	err := raw.Write(w.fn)
	n, e := w.n, w.err
	w.b = nil
	if err != nil {
		return n, err
	}
	if e != 0 {
		return n, &net.OpError{Op: "write", Net: "tcp", Source: nc.LocalAddr(), Addr: nc.RemoteAddr(),
			Err: os.NewSyscallError("write", e)}
	}
	return n, nil
}

// writeTimeout writes b to nc and fails when the socket stays unwritable
// for timeout. The deadline is armed only when b does not go out at once
// (a deadline update is a runtime timer change; a write that never waits
// needs none).
func (w *sockWriter) writeTimeout(nc net.Conn, raw syscall.RawConn, b []byte, timeout time.Duration) (int, error) {
	if raw == nil {
		nc.SetWriteDeadline(time.Now().Add(timeout))
		return nc.Write(b)
	}
	w.b, w.n, w.err = b, 0, 0
	if err := raw.Control(w.try); err != nil {
		w.b = nil
		return 0, err
	}
	if w.err == 0 && w.n < len(b) {
		nc.SetWriteDeadline(time.Now().Add(timeout))
		if err := raw.Write(w.fn); err != nil {
			n := w.n
			w.b = nil
			return n, err
		}
	}
	n, e := w.n, w.err
	w.b = nil
	if e != 0 {
		return n, &net.OpError{Op: "write", Net: "tcp", Source: nc.LocalAddr(), Addr: nc.RemoteAddr(),
			Err: os.NewSyscallError("write", e)}
	}
	return n, nil
}
