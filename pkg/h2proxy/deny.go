package h2proxy

import (
	"net/http"
	"strconv"

	"github.com/rl-tproxy/rl-tproxy/pkg/exchange"
	"github.com/rl-tproxy/rl-tproxy/pkg/httpparse"
)

// gRPC status codes the proxy answers with (google.golang.org/grpc/codes).
const (
	grpcDeadlineExceeded  = 4
	grpcResourceExhausted = 8
	grpcInternal          = 13
	grpcUnavailable       = 14
)

// GRPCDenier is implemented by a Hook that can say how a deny reads to a
// gRPC client: the status code (RESOURCE_EXHAUSTED unless configured) and
// a message naming what denied (the zone). Without it a gRPC deny is
// RESOURCE_EXHAUSTED "rate limited".
type GRPCDenier interface {
	GRPCDeny(d *exchange.Decision) (code int, message string)
}

// deny answers a stream the Hook did not allow: a gRPC request gets a
// trailers-only response (HTTP 200, grpc-status, grpc-message and
// grpc-retry-pushback-ms from Retry-After, in one HEADERS frame with
// END_STREAM); any other request gets the Hook's answer (429 with
// Retry-After and the RateLimit fields) as HTTP/1.1 clients do.
func (st *stream) deny(w http.ResponseWriter, d *exchange.Decision) {
	if d.Status == 499 { // the client is gone; nothing would be read
		st.res.ClientAborted = true
		return
	}
	if !st.grpc {
		status := d.Status
		if status == 0 {
			status = 429
		}
		st.answer(w, status, d.Header, d.Body, d.ContentType)
		return
	}
	code, msg := grpcResourceExhausted, "rate limited"
	if d.Status == http.StatusInternalServerError {
		code, msg = grpcInternal, "admission failed"
	} else if gd, ok := st.h.cfg.Hook.(GRPCDenier); ok {
		code, msg = gd.GRPCDeny(d)
	}
	st.grpcAnswer(w, code, msg, retryAfterMs(d.Header), d.Header)
}

// retryAfterMs is the deny's Retry-After in milliseconds, or -1.
func retryAfterMs(hs []httpparse.Header) int64 {
	for _, f := range hs {
		if httpparse.EqualFold(f.Name, "retry-after") {
			if s, err := strconv.ParseInt(string(f.Value), 10, 64); err == nil && s >= 0 && s < 1<<40 {
				return s * 1000
			}
		}
	}
	return -1
}

// grpcAnswer writes a trailers-only gRPC response: no body, so the codec
// sends the header block with END_STREAM. extra (the RateLimit fields)
// travel as response metadata.
func (st *stream) grpcAnswer(w http.ResponseWriter, code int, msg string, pushbackMs int64, extra []httpparse.Header) {
	h := w.Header()
	for _, f := range extra {
		h.Add(string(f.Name), string(f.Value))
	}
	h.Set("Content-Type", "application/grpc")
	h.Set("Grpc-Status", strconv.Itoa(code))
	h.Set("Grpc-Message", grpcPercentEncode(msg))
	if pushbackMs >= 0 {
		h.Set("Grpc-Retry-Pushback-Ms", strconv.FormatInt(pushbackMs, 10))
	}
	w.WriteHeader(http.StatusOK)
	st.res.Status = http.StatusOK
	st.res.End = st.h.now()
}

// grpcPercentEncode encodes a grpc-message value (gRPC over HTTP/2:
// percent-encode bytes outside 0x20-0x7E and '%').
func grpcPercentEncode(s string) string {
	const hex = "0123456789ABCDEF"
	var b []byte
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= 0x20 && c <= 0x7e && c != '%' {
			b = append(b, c)
			continue
		}
		b = append(b, '%', hex[c>>4], hex[c&15])
	}
	return string(b)
}
