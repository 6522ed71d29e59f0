package proxy

import "github.com/rl-tproxy/rl-tproxy/pkg/httpparse"

// upgradeIsH2C reports whether a request asks to upgrade to HTTP/2 over
// cleartext (Upgrade: h2c). The proxy never lets that upgrade happen: the
// upgraded connection would be one admission for a whole multiplexed
// session. The request is forwarded as plain HTTP/1.1 instead (Upgrade is
// hop-by-hop and dropped, HTTP2-Settings is named in Connection and
// dropped), which RFC 9113 3.1 allows: a server may ignore the upgrade.
// HTTP/2 clients reach per-stream admission with prior knowledge
// (pkg/h2proxy).
func upgradeIsH2C(h *httpparse.Request) bool {
	v, ok := h.Header("upgrade")
	return ok && httpparse.TokenListContains(v, "h2c")
}
