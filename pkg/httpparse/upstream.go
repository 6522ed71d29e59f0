package httpparse

// Bounds of the interim (1xx) responses an upstream may send before the
// final head of one exchange, as Go's HTTP client bounds them: past
// either, the exchange fails with ErrTooManyInterims.
const (
	MaxInterims     = 5
	MaxInterimBytes = 32 << 10
)

// ErrTooManyInterims: an upstream sent more than MaxInterims interim
// responses, or more than MaxInterimBytes of them, before its final head.
var ErrTooManyInterims = newErr(502, "interim-responses-too-many")

// Interims counts the interim responses of one exchange; the zero value
// starts an exchange.
type Interims struct{ n, bytes int }

// UpstreamLimits are the limits every upstream response head is held to,
// whichever client protocol the request came in: the package defaults,
// not a service's client limits, so that one response gets one verdict.
var UpstreamLimits = Limits{}

// ParseUpstream is the proxy's one verdict on an upstream's response
// head: it parses the head at the start of buf, answering a request with
// method reqMethod, under UpstreamLimits, and counts an interim response
// (r.Interim) in seen, failing with ErrTooManyInterims past the bounds.
// Results as for Parse; after an interim response the caller parses the
// next head at buf[r.HeadLen:].
func (r *Response) ParseUpstream(buf []byte, reqMethod []byte, seen *Interims) error {
	if err := r.Parse(buf, UpstreamLimits, reqMethod); err != nil {
		return err
	}
	if r.Interim() {
		seen.n++
		seen.bytes += r.HeadLen
		if seen.n > MaxInterims || seen.bytes > MaxInterimBytes {
			return ErrTooManyInterims
		}
	}
	return nil
}

// Interim reports an interim response: a 1xx other than 101, after which
// another head of the same exchange follows. A 101 is final: the
// connection is no longer HTTP after it.
func (r *Response) Interim() bool { return r.Status != 101 && r.Informational() }

// Reusable reports whether the connection may carry another exchange once
// this response to a request with method reqMethod has ended: an HTTP/1.1
// response without Connection: close, not close-delimited, and not one
// that leaves the connection a tunnel (a 101, a 2xx to CONNECT). Whether
// the exchange really ended cleanly (no byte after the response, the
// request fully sent) is the caller's to check.
func (r *Response) Reusable(reqMethod []byte) bool {
	if r.Close || r.Minor != 1 || r.Status == 101 {
		return false
	}
	return !(r.Status >= 200 && r.Status < 300 && EqualFold(reqMethod, "CONNECT"))
}
