//go:build !linux

package h1client

// clean reports whether a pooled connection can carry another exchange;
// without a way to peek at the socket it trusts the pool (a reuse that
// fails before any response byte is retried).
func (c *conn) clean() bool { return true }

func (c *conn) peek(uintptr) bool { return true }
