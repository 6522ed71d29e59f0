package proxy

import "github.com/rl-tproxy/rl-tproxy/pkg/httpparse"

// upgradeIsH2C reports whether a request asks to upgrade to HTTP/2 over
// cleartext (Upgrade: h2c). The proxy never lets that upgrade happen: the
// upgraded connection would be one admission for a whole multiplexed
// session. The request is forwarded as plain HTTP/1.1 instead (Upgrade is
// hop-by-hop and dropped), which RFC 9113 3.1 allows: a server may ignore
// the upgrade. When it reports true it also removes every HTTP2-Settings
// field from h.Headers: that field is meaningful only with the upgrade
// (RFC 7540 3.2.1: connection-specific), and a client that did not name it
// in Connection would otherwise have it forwarded. HTTP/2 clients reach
// per-stream admission with prior knowledge (pkg/h2proxy).
func upgradeIsH2C(h *httpparse.Request) bool {
	v, ok := h.Header("upgrade")
	if !ok || !httpparse.TokenListContains(v, "h2c") {
		return false
	}
	kept := h.Headers[:0]
	for _, f := range h.Headers {
		if len(f.Name) != len("http2-settings") || !httpparse.EqualFold(f.Name, "http2-settings") {
			kept = append(kept, f)
		}
	}
	clear(h.Headers[len(kept):]) // no stale slices into the buffer past the end
	h.Headers = kept
	return true
}
