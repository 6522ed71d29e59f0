package h1client

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/textproto"
	"strconv"
	"sync"
	"time"

	"github.com/rl-tproxy/rl-tproxy/pkg/httpparse"
)

// exchange is one response and its body, allocated together.
type exchange struct {
	res  http.Response
	body body
}

// chunkedTE is Response.TransferEncoding of a chunked response (shared:
// read-only).
var chunkedTE = []string{"chunked"}

// statusText is "200 OK" and so on for the codes net/http names.
var statusText = func() map[int]string {
	m := map[int]string{}
	for code := 100; code < 600; code++ {
		if t := http.StatusText(code); t != "" {
			m[code] = strconv.Itoa(code) + " " + t
		}
	}
	return m
}()

// response builds the response of the final head at rbuf[r:] and
// consumes the head.
func (c *conn) response(req *http.Request) (*http.Response, error) {
	resp := &c.resp
	head := c.rbuf[c.r : c.r+resp.HeadLen]
	x := &exchange{}
	res := &x.res
	res.StatusCode = resp.Status
	if s, ok := statusText[resp.Status]; ok && string(resp.Reason) == s[4:] {
		res.Status = s
	} else {
		res.Status = strconv.Itoa(resp.Status) + " " + string(resp.Reason)
	}
	res.Proto, res.ProtoMajor, res.ProtoMinor = "HTTP/1.1", 1, resp.Minor
	if resp.Minor == 0 {
		res.Proto = "HTTP/1.0"
	}
	res.Header = headerOf(head, resp.Headers, resp.BodyMode() == httpparse.BodyChunked)
	res.Request = req
	res.Close = c.close || !resp.Reusable(c.method)
	c.r += resp.HeadLen
	mode := resp.BodyMode()
	switch mode {
	case httpparse.BodyNone:
		res.ContentLength = 0
		if req.Method == http.MethodHead {
			res.ContentLength = -1
			if v, ok := resp.Header("Content-Length"); ok {
				res.ContentLength, _ = strconv.ParseInt(string(v), 10, 64)
			}
		}
	case httpparse.BodyLength:
		res.ContentLength = resp.ContentLength
	case httpparse.BodyChunked:
		res.ContentLength = -1
		res.TransferEncoding = chunkedTE
		c.chunk.Reset(httpparse.UpstreamLimits)
	default:
		res.ContentLength = -1
	}
	c.mu.Lock()
	c.headDone = true
	_ = c.nc.SetReadDeadline(time.Time{})
	c.mu.Unlock()
	if mode == httpparse.BodyNone || mode == httpparse.BodyLength && resp.ContentLength == 0 {
		res.Body = http.NoBody
		c.release(true)
		return res, nil
	}
	x.body = body{c: c, res: res, mode: mode, left: resp.ContentLength, gen: c.gen}
	res.Body = &x.body
	return res, nil
}

// headerOf is the http.Header of the fields hs of head. One string holds
// the head's bytes: every value, and every name already in canonical
// form, is a substring of it, and the values' one-element slices share
// one backing array. A chunked response's Transfer-Encoding is left out
// (it is Response.TransferEncoding).
func headerOf(head []byte, hs []httpparse.Header, chunked bool) http.Header {
	if len(hs) == 0 {
		return http.Header{}
	}
	s := string(head)
	base := cap(head)
	h := make(http.Header, len(hs))
	vals := make([]string, len(hs))
	for i, f := range hs {
		if chunked && len(f.Name) == len("Transfer-Encoding") && httpparse.EqualFold(f.Name, "Transfer-Encoding") {
			continue
		}
		off := base - cap(f.Name)
		k := textproto.CanonicalMIMEHeaderKey(s[off : off+len(f.Name)])
		v := ""
		if len(f.Value) > 0 {
			off = base - cap(f.Value)
			v = s[off : off+len(f.Value)]
		}
		vals[i] = v
		if prior, ok := h[k]; ok {
			h[k] = append(prior, v)
			continue
		}
		h[k] = vals[i : i+1 : i+1]
	}
	return h
}

// trailerOf is the http.Header of trailer fields (rare: each one copied
// on its own).
func trailerOf(hs []httpparse.Header) http.Header {
	h := make(http.Header, len(hs))
	for _, f := range hs {
		k := textproto.CanonicalMIMEHeaderKey(string(f.Name))
		h[k] = append(h[k], string(f.Value))
	}
	return h
}

// body is a response body streamed from its connection. Read and Close
// may be called from different goroutines; Close unblocks a Read in
// flight.
type body struct {
	c    *conn
	res  *http.Response
	mode httpparse.BodyMode
	left int64  // BodyLength: bytes still to come
	pend []byte // BodyChunked: decoded data not handed out yet (in c.rbuf)
	gen  uint64 // c.gen of this exchange

	mu   sync.Mutex
	err  error // sticky: io.EOF at the end, or the failure
	done bool  // the exchange was released
}

// Read reads body bytes: from what the connection's buffer holds, else
// (a Content-Length or close-delimited body) straight from the
// connection into p. At the end of a body the connection is released
// (pooled when clean) and Read returns io.EOF; a failure closes it.
func (b *body) Read(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.err != nil {
		return 0, b.err
	}
	if len(p) == 0 {
		return 0, nil
	}
	var n int
	var err error
	switch b.mode {
	case httpparse.BodyLength:
		n, err = b.readLength(p)
	case httpparse.BodyChunked:
		n, err = b.readChunked(p)
	default:
		n, err = b.readClose(p)
	}
	if err != nil {
		if err != io.EOF {
			err = b.c.exchangeErr(err)
		}
		b.err = err
		b.finish(err == io.EOF)
	}
	return n, err
}

func (b *body) readLength(p []byte) (int, error) {
	c := b.c
	if int64(len(p)) > b.left {
		p = p[:b.left]
	}
	var n int
	if c.r < c.w {
		n = copy(p, c.rbuf[c.r:c.w])
		c.r += n
	} else {
		c.bodyDeadline()
		var err error
		n, err = c.nc.Read(p)
		if n == 0 && err != nil {
			if err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			return 0, err
		}
	}
	b.left -= int64(n)
	if b.left == 0 {
		return n, io.EOF
	}
	return n, nil
}

func (b *body) readClose(p []byte) (int, error) {
	c := b.c
	if c.r < c.w {
		n := copy(p, c.rbuf[c.r:c.w])
		c.r += n
		return n, nil
	}
	c.bodyDeadline()
	n, err := c.nc.Read(p)
	if n > 0 {
		return n, nil
	}
	if err == nil {
		return 0, nil
	}
	return 0, err // io.EOF: the body's end
}

// readChunked decodes what the buffer holds into p, reading more only
// when nothing could be handed out.
func (b *body) readChunked(p []byte) (int, error) {
	c := b.c
	n := 0
	for n < len(p) {
		if len(b.pend) > 0 {
			k := copy(p[n:], b.pend)
			b.pend = b.pend[k:]
			n += k
			continue
		}
		k, data, err := c.chunk.Decode(c.rbuf[c.r:c.w])
		c.r += k
		switch {
		case err == nil && len(data) > 0:
			b.pend = data
		case err == nil:
			if len(c.chunk.Trailers) > 0 {
				b.res.Trailer = trailerOf(c.chunk.Trailers)
			}
			return n, io.EOF
		case err == httpparse.ErrNeedMore:
			if n > 0 {
				return n, nil
			}
			c.bodyDeadline()
			if err := c.fill(); err != nil {
				if err == io.EOF {
					err = io.ErrUnexpectedEOF
				}
				return 0, err
			}
		default:
			return n, fmt.Errorf("chunked coding: %w", err)
		}
	}
	return n, nil
}

// bodyDeadline bounds the next read of the body by BodyIdle.
func (c *conn) bodyDeadline() {
	if d := c.p.cfg.BodyIdle; d > 0 {
		_ = c.nc.SetReadDeadline(time.Now().Add(d))
	}
}

// finish releases the exchange once.
func (b *body) finish(clean bool) {
	if b.done {
		return
	}
	b.done = true
	b.c.release(clean)
}

// Close ends the body: a body not read to its end closes the connection
// (what is left of it is never read). A Read blocked on the connection
// returns at once.
func (b *body) Close() error {
	c := b.c
	c.mu.Lock()
	if c.gen == b.gen {
		_ = c.nc.SetReadDeadline(aLongTimeAgo)
	}
	c.mu.Unlock()
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.err == nil {
		b.err = errBodyClosed
	}
	b.finish(false)
	return nil
}

var aLongTimeAgo = time.Unix(1, 0)

// errBodyClosed is what Read returns after Close.
var errBodyClosed = errors.New("h1client: read on a closed response body")
