package testkit

import (
	"bytes"
	"runtime"
	"strconv"
)

// GoroutineID is the running goroutine's id, from its stack header. Tests
// use it to tell which goroutine (an event loop's locked thread, or
// another) ran a callback; never for anything else.
func GoroutineID() uint64 {
	var b [64]byte
	s := b[:runtime.Stack(b[:], false)]
	s = bytes.TrimPrefix(s, []byte("goroutine "))
	i := bytes.IndexByte(s, ' ')
	if i < 0 {
		return 0
	}
	n, _ := strconv.ParseUint(string(s[:i]), 10, 64)
	return n
}
