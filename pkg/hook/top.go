package hook

import "github.com/rl-tproxy/rl-tproxy/pkg/admission"

// recordTop feeds the zones' top-keys summaries: each rendered bucket of
// an allow as an allow, each zone that was short in a deny (as
// countDenials counts it) as a deny. It allocates nothing.
func recordTop(info *locInfo, dec *admission.Decision, unixNs int64) {
	if len(info.top) == 0 {
		return
	}
	res := dec.Req.Resources
	switch {
	case dec.Result.Valid && dec.Verdict == admission.VerdictAllow:
		for i := range res {
			if i < len(info.top) {
				info.top[i].Allow(res[i].Bucket, unixNs)
			}
		}
	case dec.Result.Valid && dec.Verdict == admission.VerdictDeny:
		for i, rr := range dec.Result.Resp.Resources {
			if rr.TokensDeficit > 0 && i < len(info.top) && i < len(res) {
				info.top[i].Deny(res[i].Bucket, unixNs)
			}
		}
	case dec.Local:
		for i, z := range dec.Zones {
			if i >= len(info.top) || i >= len(res) {
				break
			}
			if !dec.LocalAllowed && z.Known && z.RetryAfterMs > 0 {
				info.top[i].Deny(res[i].Bucket, unixNs)
			} else if dec.LocalAllowed {
				info.top[i].Allow(res[i].Bucket, unixNs)
			}
		}
	}
}
