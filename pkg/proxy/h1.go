package proxy

import (
	"errors"
	"net"
	"strconv"

	"github.com/rl-tproxy/rl-tproxy/pkg/httpparse"
)

// Small pieces of HTTP/1.1 the loop path's state machine shares.

var continue100 = []byte("HTTP/1.1 100 Continue\r\n\r\n")

// errBodyTooLarge: a chunked request body exceeded Service.MaxBodyBytes.
var errBodyTooLarge = errors.New("proxy: request body too large")

// idempotent reports whether a request with method m may be replayed on a
// fresh upstream connection.
func idempotent(m []byte) bool {
	switch string(m) {
	case "GET", "HEAD", "OPTIONS", "TRACE", "PUT", "DELETE":
		return true
	}
	return false
}

// headNeed is the most buffer a request head under lim can need.
func headNeed(lim httpparse.Limits) int {
	l, h := lim.MaxRequestLine, lim.MaxHeaderBytes
	if l <= 0 {
		l = httpparse.DefaultMaxRequestLine
	}
	if h <= 0 {
		h = httpparse.DefaultMaxHeaderBytes
	}
	return max(l, h) + 4
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// splitTarget splits an origin- or absolute-form target into path and
// query.
func splitTarget(t []byte) (path, query []byte) {
	if len(t) > 0 && t[0] != '/' {
		// absolute-form: skip scheme://authority
		for i := 0; i+2 < len(t); i++ {
			if t[i] == ':' && t[i+1] == '/' && t[i+2] == '/' {
				rest := t[i+3:]
				j := 0
				for j < len(rest) && rest[j] != '/' && rest[j] != '?' {
					j++
				}
				t = rest[j:]
				break
			}
		}
	}
	for i, b := range t {
		if b == '?' {
			return t[:i], t[i+1:]
		}
	}
	return t, nil
}

// statusBody is the plain-text body of an answer from the proxy itself.
func statusBody(status int) string {
	switch status {
	case 400:
		return "400 Bad Request\n"
	case 408:
		return "408 Request Timeout\n"
	case 413:
		return "413 Content Too Large\n"
	case 414:
		return "414 URI Too Long\n"
	case 417:
		return "417 Expectation Failed\n"
	case 431:
		return "431 Request Header Fields Too Large\n"
	case 501:
		return "501 Not Implemented\n"
	case 502:
		return "502 Bad Gateway\n"
	case 503:
		return "503 Service Unavailable\n"
	case 504:
		return "504 Gateway Timeout\n"
	case 505:
		return "505 HTTP Version Not Supported\n"
	}
	return strconv.Itoa(status) + "\n"
}
