package proxy

import (
	"github.com/rl-tproxy/rl-tproxy/pkg/exchange"
	"github.com/rl-tproxy/rl-tproxy/pkg/httpparse"
)

// upgradeIsH2C reports whether a request asks to upgrade to HTTP/2 over
// cleartext (Upgrade: h2c). The proxy never lets that upgrade happen: the
// upgraded connection would be one admission for a whole multiplexed
// session. The request is forwarded as plain HTTP/1.1 instead (Upgrade is
// hop-by-hop and dropped), which RFC 9113 3.1 allows: a server may ignore
// the upgrade. HTTP/2 clients reach per-stream admission with prior
// knowledge (pkg/h2proxy).
func upgradeIsH2C(h *httpparse.Request) bool {
	v, ok := h.Header("upgrade")
	return ok && httpparse.TokenListContains(v, "h2c")
}

// dropHTTP2Settings removes every HTTP2-Settings field from h.Headers.
// The field means something only with an h2c upgrade (RFC 7540 3.2.1:
// connection-specific), and the proxy never performs one, so it is never
// part of a real upgrade here: it goes whether the request named it in
// Connection or not, whether Connection lists "upgrade" or not, and
// whether an Upgrade field came at all. A request without the field (the
// common case) costs one length compare per field.
func dropHTTP2Settings(h *httpparse.Request) {
	i := 0
	for i < len(h.Headers) && !exchange.IsHTTP2Settings(h.Headers[i].Name) {
		i++
	}
	if i == len(h.Headers) {
		return
	}
	kept := h.Headers[:i]
	for _, f := range h.Headers[i:] {
		if !exchange.IsHTTP2Settings(f.Name) {
			kept = append(kept, f)
		}
	}
	clear(h.Headers[len(kept):]) // no stale slices into the buffer past the end
	h.Headers = kept
}
