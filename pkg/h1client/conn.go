package h1client

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/rl-tproxy/rl-tproxy/pkg/httpparse"
)

// readBufSize is a connection's read buffer while an exchange runs (no
// buffer while it idles): room for the largest head UpstreamLimits allow
// and the body bytes read with it.
const readBufSize = 32 << 10

// writeBufSize is the initial request staging buffer of a connection: a
// request head and as much of a known-length body as fits go out in one
// write.
const writeBufSize = 8 << 10

// maxKeptWriteBuf bounds the staging buffer a connection keeps after a
// larger head grew it.
const maxKeptWriteBuf = 64 << 10

var readBufs = sync.Pool{New: func() any { b := make([]byte, readBufSize); return &b }}

// conn is one upstream connection. One exchange at a time uses it: the
// request's goroutine, the goroutine that writes a request body, and the
// response body's reader.
type conn struct {
	p  *Pool
	nc net.Conn
	rc syscall.RawConn // for the reuse check; nil when nc has none

	rbufp *[]byte // from readBufs while an exchange runs
	rbuf  []byte
	r, w  int // unread bytes: rbuf[r:w]

	wbuf []byte   // request staging, kept for the connection's life
	keys []string // scratch: the request's field names, sorted

	resp  httpparse.Response
	seen  httpparse.Interims
	chunk httpparse.ChunkedDecoder

	// The exchange.
	ctx     context.Context
	stop    func() bool // stops the abort on the context
	method  []byte      // the request's method, for the body rules
	close   bool        // the request said Connection: close
	reused  bool        // taken from the pool
	readAny bool        // a response byte arrived
	aborted atomic.Bool // the context ended: the connection was closed

	// mu orders the body writer against the head reader (the head
	// deadline starts when the body ends, unless the head came first)
	// and guards gen against a concurrent Body.Close.
	mu       sync.Mutex
	headDone bool
	writing  bool  // the body writer runs
	werr     error // how the body write failed
	gen      uint64

	idleSince time.Time
	timer     *time.Timer
	peekByte  [1]byte
	peekFn    func(fd uintptr) bool
	peekClean bool
	abortFn   func()
}

func newConn(p *Pool, nc net.Conn) *conn {
	c := &conn{p: p, nc: nc, wbuf: make([]byte, 0, writeBufSize)}
	if sc, ok := nc.(syscall.Conn); ok {
		if rc, err := sc.SyscallConn(); err == nil {
			c.rc = rc
			c.peekFn = c.peek
		}
	}
	c.abortFn = c.abort
	return c
}

// abort ends the exchange when its context ends: closing the connection
// unblocks every read and write on it.
func (c *conn) abort() {
	c.aborted.Store(true)
	_ = c.nc.Close()
}

// begin prepares c for an exchange of req.
func (c *conn) begin(req *http.Request) {
	c.rbufp = readBufs.Get().(*[]byte)
	c.rbuf = *c.rbufp
	c.r, c.w = 0, 0
	c.seen = httpparse.Interims{}
	c.readAny = false
	c.ctx = req.Context()
	c.method = append(c.method[:0], req.Method...)
	c.close = req.Close || c.p.cfg.MaxIdle <= 0
	c.headDone, c.writing, c.werr = false, false, nil
	c.stop = nil
	if c.ctx.Done() != nil {
		c.stop = context.AfterFunc(c.ctx, c.abortFn)
	}
}

// roundTrip runs req's exchange on c up to the final response head.
func (c *conn) roundTrip(req *http.Request) (*http.Response, error) {
	cfg := &c.p.cfg
	c.begin(req)
	hasBody := req.Body != nil && req.Body != http.NoBody
	chunked := hasBody && req.ContentLength <= 0
	head, err := appendHead(c.wbuf[:0], &c.keys, req, hasBody, chunked, c.close)
	if err != nil {
		// Nothing was sent: the connection stays as clean as it was.
		c.unused()
		closeReqBody(req)
		return nil, err
	}
	var deadline time.Time
	if cfg.HeadTimeout > 0 && !hasBody {
		deadline = time.Now().Add(cfg.HeadTimeout)
	}
	_ = c.nc.SetDeadline(deadline)
	if hasBody {
		c.writing = true
		go c.writeBody(req, head, chunked)
	} else {
		_, err := c.nc.Write(head)
		c.keepWriteBuf(head)
		if err != nil {
			err = c.exchangeErr(fmt.Errorf("write request head: %w", err))
			c.release(false)
			return nil, err
		}
	}
	res, err := c.readHead(req)
	if err != nil {
		c.mu.Lock()
		if c.werr != nil {
			err = c.werr
		}
		c.mu.Unlock()
		err = c.exchangeErr(err)
		c.release(false)
		return nil, err
	}
	return res, nil
}

// exchangeErr is err, or the context's error when the context ended the
// exchange.
func (c *conn) exchangeErr(err error) error {
	if c.aborted.Load() {
		if cerr := c.ctx.Err(); cerr != nil {
			return cerr
		}
	}
	return err
}

// keepWriteBuf keeps b (c.wbuf, perhaps grown) as the staging buffer.
func (c *conn) keepWriteBuf(b []byte) {
	if cap(b) <= maxKeptWriteBuf {
		c.wbuf = b[:0]
	}
}

// writeBody writes the request head and body (its own goroutine: the
// response may come before the body ends). A failure closes the
// connection: the upstream would wait for the rest of the request.
func (c *conn) writeBody(req *http.Request, head []byte, chunked bool) {
	err := c.sendBody(req, head, chunked)
	closeReqBody(req)
	if err != nil {
		c.mu.Lock()
		c.werr = fmt.Errorf("write request: %w", err)
		c.mu.Unlock()
		_ = c.nc.Close()
	}
	c.mu.Lock()
	c.writing = false
	if err == nil && !c.headDone && c.p.cfg.HeadTimeout > 0 {
		_ = c.nc.SetReadDeadline(time.Now().Add(c.p.cfg.HeadTimeout))
	}
	c.mu.Unlock()
}

// readHead reads response heads until the final one and returns the
// response for it.
func (c *conn) readHead(req *http.Request) (*http.Response, error) {
	for {
		err := c.resp.ParseUpstream(c.rbuf[c.r:c.w], c.method, &c.seen)
		if err == nil {
			if c.resp.Interim() {
				c.r += c.resp.HeadLen
				continue
			}
			break
		}
		if err != httpparse.ErrNeedMore {
			return nil, headError(err)
		}
		if err := c.fill(); err != nil {
			return nil, headError(err)
		}
	}
	if c.resp.Status == 101 {
		return nil, headError(errUpgrade)
	}
	return c.response(req)
}

// errBufferFull: unreachable while readBufSize holds the largest head,
// chunk line and trailer section the limits allow.
var errBufferFull = errors.New("read buffer full")

// fill reads more bytes into rbuf, moving the unread ones to its start.
func (c *conn) fill() error {
	if c.r > 0 {
		c.w = copy(c.rbuf, c.rbuf[c.r:c.w])
		c.r = 0
	}
	if c.w == len(c.rbuf) {
		return errBufferFull
	}
	n, err := c.nc.Read(c.rbuf[c.w:])
	if n > 0 {
		c.w += n
		c.readAny = true
		return nil
	}
	if err == nil {
		err = errors.New("empty read")
	}
	return err
}

// unused ends an exchange that sent nothing: c goes back to the pool.
func (c *conn) unused() {
	if c.stop != nil && !c.stop() {
		c.stop = nil
		c.release(false)
		return
	}
	c.stop, c.ctx = nil, nil
	readBufs.Put(c.rbufp)
	c.rbufp, c.rbuf = nil, nil
	c.reused = false
	c.p.put(c)
}

// release ends the exchange: c goes back to the pool when clean says the
// response ended on its framing and nothing else disqualifies it, else
// it is closed.
func (c *conn) release(clean bool) {
	keep := clean && c.r == c.w && !c.close && c.resp.Reusable(c.method)
	if c.stop != nil && !c.stop() {
		keep = false // the context ended: abort closes the connection
	}
	c.stop, c.ctx = nil, nil
	c.mu.Lock()
	if c.writing || c.werr != nil {
		keep = false // the request did not go out whole
	}
	c.gen++
	c.mu.Unlock()
	if c.rbufp != nil {
		readBufs.Put(c.rbufp)
		c.rbufp, c.rbuf = nil, nil
	}
	c.r, c.w = 0, 0
	if !keep {
		_ = c.nc.Close()
		return
	}
	c.reused = false
	c.p.put(c)
}
