package hook

import (
	"context"
	"log/slog"
	"strings"

	"github.com/rl-tproxy/rl-tproxy/pkg/accesslog"
	"github.com/rl-tproxy/rl-tproxy/pkg/admission"
	"github.com/rl-tproxy/rl-tproxy/pkg/exchange"
)

// logAccess writes the access line (docs/metrics.md lists its fields).
func (g *Gate) logAccess(r *exchange.Request, d *exchange.Decision, res *exchange.Result, st *state, outcome admission.Outcome, reported bool) {
	if !g.access.Enabled(context.Background(), slog.LevelInfo) {
		return
	}
	loc := "-"
	if st.info != nil {
		loc = st.info.name
	}
	var method, host []byte
	if r.Head != nil {
		method, host = r.Head.Method, r.Head.Host
	}
	end := res.End
	if end.IsZero() {
		end = g.now()
	}
	proto := r.Proto
	if proto == "" {
		proto = "-" // a path that did not say (exchange.Request.Proto)
	}
	client, peer := r.Remote, r.Remote
	if st.areq.Peer.IsValid() { // named by the service's client_address
		client, peer = st.areq.Remote, st.areq.Peer
	}
	attrs := make([]slog.Attr, 0, 33)
	attrs = append(attrs,
		slog.String("service", st.svc),
		slog.String("location", loc),
		slog.String(accesslog.Remote, client.String()),
		slog.String("peer", peer.String()),
		slog.String(accesslog.Method, string(method)),
		slog.String("host", string(host)),
		slog.String(accesslog.Path, string(r.Path)),
	)
	if len(r.Query) > 0 {
		attrs = append(attrs, slog.String(accesslog.Query, string(r.Query)))
	}
	if len(r.SNI) > 0 || len(r.ALPN) > 0 {
		attrs = append(attrs, slog.String("sni", string(r.SNI)), slog.String("alpn", string(r.ALPN)))
	}
	attrs = append(attrs,
		slog.String(accesslog.Proto, proto),
		slog.Int(accesslog.Status, res.Status),
		slog.String("verdict", verdictOf(st.dec.Verdict, outcome).String()),
		slog.String("outcome", outcome.String()),
		slog.String("cause", st.dec.Cause.String()),
	)
	if zones, guards := deniedBy(&st.dec); zones != "" || guards != "" {
		if zones != "" {
			attrs = append(attrs, slog.String("deny_zones", zones))
		}
		if guards != "" {
			attrs = append(attrs, slog.String("deny_guards", guards))
		}
	}
	if !d.Allow && st.dec.Action == admission.ActionDeny {
		ra := admission.RetryAfterSeconds(st.dec.Zones)
		if st.info != nil {
			ra = st.info.answer.RetryAfter(&st.dec)
		}
		attrs = append(attrs, slog.Uint64("retry_after", uint64(ra)))
	}
	attrs = append(attrs,
		slog.Float64("admission_ms", float64(st.dec.Admission.Microseconds())/1000),
		slog.Float64("duration_ms", float64(end.Sub(r.Start).Microseconds())/1000),
	)
	if res.Upstream != "" {
		attrs = append(attrs, slog.String("upstream", res.Upstream))
		if res.UpstreamStatus != 0 {
			attrs = append(attrs, slog.Int("upstream_status", res.UpstreamStatus),
				slog.Float64("upstream_ttfb_ms", float64(res.UpstreamTTFB.Microseconds())/1000))
		}
	}
	attrs = append(attrs,
		slog.Int64("bytes_in", res.BytesIn),
		slog.Int64(accesslog.BytesOut, res.BytesOut),
		slog.Bool("report", reported),
	)
	if len(st.rid) > 0 {
		attrs = append(attrs, slog.String("request_id", string(st.rid)))
	}
	if r.Head != nil {
		for _, f := range [...]struct{ name, key string }{{"traceparent", "traceparent"}, {"referer", accesslog.Referer}, {"user-agent", accesslog.UserAgent}} {
			if v, ok := r.Head.Header(f.name); ok && len(v) > 0 {
				attrs = append(attrs, slog.String(f.key, string(v)))
			}
		}
	}
	if st.gen != nil {
		attrs = append(attrs, slog.Uint64("generation", st.gen.gen))
	}
	if res.UpstreamErr != nil {
		attrs = append(attrs, slog.String("upstream_error", res.UpstreamErr.Error()))
	}
	g.access.LogAttrs(context.Background(), slog.LevelInfo, accesslog.Message, attrs...)
}

// countDenials counts the zones that were short and the guards that
// failed in a deny, as deniedBy names them (no allocation).
func countDenials(info *locInfo, dec *admission.Decision) {
	switch {
	case dec.Result.Valid && dec.Verdict == admission.VerdictDeny:
		for i, rr := range dec.Result.Resp.Resources {
			if rr.TokensDeficit > 0 && i < len(info.zoneDenials) {
				info.zoneDenials[i].Inc()
			}
		}
		for i, gr := range dec.Result.Resp.Guards {
			if !gr.Passed && i < len(info.guardDenials) {
				info.guardDenials[i].Inc()
			}
		}
	case dec.Local && !dec.LocalAllowed:
		for i, z := range dec.Zones {
			if z.Known && z.RetryAfterMs > 0 && i < len(info.zoneDenials) {
				info.zoneDenials[i].Inc()
			}
		}
	}
}

// deniedBy names the zones that were short and the guards (by tracker)
// that failed in a deny (or a shadow "would deny"): from RateLimitly's
// answer, or from the local buckets under fail: local.
func deniedBy(dec *admission.Decision) (zones, guards string) {
	loc := dec.Location
	if loc == nil {
		return "", ""
	}
	var zs, gs []string
	switch {
	case dec.Result.Valid && dec.Verdict == admission.VerdictDeny:
		for i, rr := range dec.Result.Resp.Resources {
			if rr.TokensDeficit > 0 && i < len(loc.Limits) {
				zs = append(zs, loc.Limits[i].Name)
			}
		}
		for i, gr := range dec.Result.Resp.Guards {
			if !gr.Passed && i < len(loc.Guards) {
				gs = append(gs, loc.Guards[i].Tracker.Name)
			}
		}
	case dec.Local && !dec.LocalAllowed:
		for i, z := range dec.Zones {
			if z.Known && z.RetryAfterMs > 0 && i < len(loc.Limits) {
				zs = append(zs, loc.Limits[i].Name)
			}
		}
	}
	return strings.Join(zs, ","), strings.Join(gs, ",")
}

// verdictOf is the access log's verdict: none for every aborted outcome,
// whatever RateLimitly answered before the client went away (the
// contract: "not found for ... every aborted outcome").
func verdictOf(v admission.Verdict, outcome admission.Outcome) admission.Verdict {
	if outcome == admission.OutcomeClientAbort {
		return admission.VerdictNone
	}
	return v
}
