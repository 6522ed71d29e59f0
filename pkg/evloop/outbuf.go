package evloop

// Write queues take buffers in size classes of BufSize<<k (k <
// outClasses: 16 KiB to 1 MiB at the default size). A queue that needs
// more room than its buffer has moves its unsent bytes to the front or
// into a buffer of a larger class (Sock.reserve), and buffers go back to
// the loop's free lists, so a long stream neither allocates in steady
// state nor holds more than a few times its unsent bytes.
const outClasses = 7

// freeLimit bounds the free buffers the loop keeps of class k: 64 of the
// base size (one per socket with queued bytes), and of each larger class
// about 2 MiB worth (at least 2): enough that a few long streams at once
// take their buffers from the loop, and at most ~13 MiB held per loop
// after a burst at the default BufSize.
func (l *Loop) freeLimit(k int) int {
	if k == 0 {
		return 64
	}
	return max(2, (2<<20)/(l.bufSize<<k))
}

// getBuf returns an empty write-queue buffer with room for n bytes: of
// the smallest class that holds n, or of exactly n above the classes.
func (l *Loop) getBuf(n int) []byte {
	l.nBufs.Add(1)
	k := 0
	for k < outClasses && l.bufSize<<k < n {
		k++
	}
	if k == outClasses {
		return make([]byte, 0, n)
	}
	if free := l.wbufs[k]; len(free) > 0 {
		b := free[len(free)-1]
		free[len(free)-1] = nil
		l.wbufs[k] = free[:len(free)-1]
		return b[:0]
	}
	return make([]byte, 0, l.bufSize<<k)
}

func (l *Loop) putBuf(b []byte) {
	l.nBufs.Add(-1)
	for k := 0; k < outClasses; k++ {
		if cap(b) == l.bufSize<<k {
			if len(l.wbufs[k]) < l.freeLimit(k) {
				l.wbufs[k] = append(l.wbufs[k], b[:0])
			}
			return
		}
	}
}
