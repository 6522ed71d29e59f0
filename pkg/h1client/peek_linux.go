package h1client

import (
	"syscall"
	"unsafe"
)

// clean reports whether a pooled connection can carry another exchange:
// nothing is queued on it, neither bytes (a response nobody asked for,
// the rest of an over-long one) nor the upstream's close. It peeks at
// the socket without blocking: EAGAIN is the only clean answer.
func (c *conn) clean() bool {
	if c.rc == nil {
		return true // nothing to peek with: a failed reuse is retried
	}
	c.peekClean = false
	if err := c.rc.Read(c.peekFn); err != nil {
		return false
	}
	return c.peekClean
}

// peek is clean's look at the socket (one recv, MSG_PEEK|MSG_DONTWAIT).
func (c *conn) peek(fd uintptr) bool {
	_, _, e := syscall.RawSyscall6(syscall.SYS_RECVFROM, fd, uintptr(unsafe.Pointer(&c.peekByte[0])), 1,
		syscall.MSG_PEEK|syscall.MSG_DONTWAIT, 0, 0)
	c.peekClean = e == syscall.EAGAIN
	return true
}
