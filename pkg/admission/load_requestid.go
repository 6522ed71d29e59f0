package admission

import (
	"strings"

	"gopkg.in/yaml.v3"
)

// RequestID is the `request_id` block: the field that carries a request
// id to the upstream, into the deny answer and into the access log.
type RequestID struct {
	// Header is the field name (default X-Request-ID). A valid id the
	// client sent in it is passed through unchanged.
	Header string
	// Generate makes the proxy create an id when the request has none or
	// an invalid one (default true); false only passes valid ids through.
	Generate bool
}

// DefaultRequestIDHeader is the request id field unless the policy names another.
const DefaultRequestIDHeader = "X-Request-ID"

var requestIDKeys = []string{"header", "generate"}

// requestIDReserved are fields the proxy writes or drops itself; a request
// id cannot live in one of them.
var requestIDReserved = []string{"host", "connection", "content-length", "transfer-encoding", "te", "trailer",
	"upgrade", "keep-alive", "proxy-connection", "expect", "x-forwarded-for", "x-forwarded-proto", "forwarded",
	"x-real-ip", "retry-after", "ratelimit", "ratelimit-policy", "content-type", "traceparent", "tracestate"}

// requestID reads the request_id block (n may be nil: the defaults).
func (l *loader) requestID(n *yaml.Node) {
	l.p.RequestID = RequestID{Header: DefaultRequestIDHeader, Generate: true}
	if n == nil {
		return
	}
	pairs, ok := l.mapping(n, "request_id", requestIDKeys...)
	if !ok {
		return
	}
	for _, e := range pairs {
		switch e.key {
		case "header":
			s, ok := l.str(e.v, "request_id.header")
			if !ok {
				continue
			}
			if !validFieldName(s) {
				l.errorf(e.v, "request_id.header: %q is not an HTTP field name (1 to 64 token characters)", short(s))
				continue
			}
			for _, r := range requestIDReserved {
				if strings.EqualFold(s, r) {
					l.errorf(e.v, "request_id.header: %s is a field the proxy sets or drops itself", s)
					ok = false
					break
				}
			}
			if ok {
				l.p.RequestID.Header = s
			}
		case "generate":
			if b, ok := l.boolean(e.v, "request_id.generate"); ok {
				l.p.RequestID.Generate = *b
			}
		}
	}
}

// validFieldName: an RFC 9110 token of at most 64 bytes.
func validFieldName(s string) bool {
	if len(s) == 0 || len(s) > 64 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		case strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0:
		default:
			return false
		}
	}
	return true
}
