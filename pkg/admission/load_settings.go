package admission

import (
	"fmt"
	"math"
	"strings"
	"time"

	"gopkg.in/yaml.v3"
)

// serviceSetting parses one inheritable service-level key into s. It
// returns false when the key is not a service-level setting.
func (l *loader) serviceSetting(e kv, ctx string, s *serviceSettings) bool {
	c := ctx + "." + e.key
	switch e.key {
	case "forwarded_headers":
		pairs, ok := l.mapping(e.v, c, "x_forwarded_for", "x_forwarded_proto", "forwarded", "x_real_ip")
		if !ok {
			return true
		}
		for _, f := range pairs {
			b, ok := l.boolean(f.v, c+"."+f.key)
			if !ok {
				continue
			}
			switch f.key {
			case "x_forwarded_for":
				s.xff = b
			case "x_forwarded_proto":
				s.xfp = b
			case "forwarded":
				s.fwd = b
			case "x_real_ip":
				s.xri = b
			}
		}
	case "timeouts":
		pairs, ok := l.mapping(e.v, c, "header", "idle", "upstream", "admission")
		if !ok {
			return true
		}
		for _, f := range pairs {
			if f.key == "admission" {
				if d, ok := l.admissionTimeout(f.v, c+".admission"); ok {
					s.admissionTimeout = &d
				}
				continue
			}
			d, ok := l.duration(f.v, c+"."+f.key, time.Millisecond, maxDuration)
			if !ok {
				continue
			}
			switch f.key {
			case "header":
				s.headerTimeout = &d
			case "idle":
				s.idleTimeout = &d
			case "upstream":
				s.upstreamTimeout = &d
			}
		}
	case "limits":
		pairs, ok := l.mapping(e.v, c, append([]string{"max_request_line", "max_header_bytes", "max_headers", "max_body_bytes", "max_requests_per_conn"}, h2LimitKeys...)...)
		if !ok {
			return true
		}
		for _, f := range pairs {
			fc := c + "." + f.key
			switch f.key {
			case "max_request_line":
				if n, ok := l.size(f.v, fc, 1<<20); ok && l.positive(f.v, fc, n) {
					s.maxRequestLine = &n
				}
			case "max_header_bytes":
				if n, ok := l.size(f.v, fc, 1<<20); ok && l.positive(f.v, fc, n) {
					s.maxHeaderBytes = &n
				}
			case "max_headers":
				if n, ok := l.integer(f.v, fc, 1, 10000); ok {
					s.maxHeaders = &n
				}
			case "max_body_bytes":
				if n, ok := l.size(f.v, fc, math.MaxInt64); ok {
					s.maxBodyBytes = &n
				}
			case "max_requests_per_conn":
				if n, ok := l.integer(f.v, fc, 0, math.MaxInt32); ok {
					s.maxRequestsPerConn = &n
				}
			default:
				l.h2Limit(f, fc, &s.h2)
			}
		}
	case "ratelimit_headers":
		if f, ok := l.rateLimitFields(e.v, c); ok {
			s.rateLimitHeaders = &f
		}
	case "steer_loopback":
		if b, ok := l.boolean(e.v, c); ok {
			s.steerLoopback = b
		}
	case "upstream_protocol":
		l.upstreamProtocol(e.v, c, s)
	case "client_address":
		l.clientAddress(e.v, c, s)
	case "escaped_slashes":
		l.escapedSlashes(e.v, c, s)
	default:
		return false
	}
	return true
}

// rateLimitFields parses ratelimit_headers: true (deny answers), false
// (none) or all (deny answers and allowed responses).
func (l *loader) rateLimitFields(v *yaml.Node, ctx string) (RateLimitFields, bool) {
	const want = "true, false or all"
	if !l.scalar(v, ctx, want, "!!bool", "!!str") {
		return 0, false
	}
	switch strings.ToLower(v.Value) {
	case "true":
		if v.Tag == "!!bool" {
			return RateLimitFieldsDeny, true
		}
	case "false":
		if v.Tag == "!!bool" {
			return RateLimitFieldsOff, true
		}
	case "all":
		if v.Tag == "!!str" {
			return RateLimitFieldsAll, true
		}
	}
	l.errorf(v, "%s: want %s, got %s", ctx, want, kindName(v))
	return 0, false
}

// admissionTimeout parses timeouts.admission: a duration up to
// MaxAdmissionTimeout that exceeds the request policy's horizon (parsed
// before any service setting). A shorter one would answer 503 while a
// RateLimitly check may still be on its way, before its failure policy
// (fail: open or closed) could decide.
func (l *loader) admissionTimeout(v *yaml.Node, ctx string) (time.Duration, bool) {
	d, ok := l.duration(v, ctx, time.Millisecond, MaxAdmissionTimeout)
	if !ok {
		return 0, false
	}
	rl := &l.p.RateLimitly
	if h := rl.Horizon; d <= h {
		l.errorf(v, "%s: %s must exceed the request policy's horizon %s (ratelimitly.request_policy %s): "+
			"a shorter wait answers 503 before the check's failure policy can decide", ctx, d, h, rl.RequestPolicy.Name)
		return 0, false
	}
	return d, true
}

func (l *loader) positive(v *yaml.Node, ctx string, n int64) bool {
	if n <= 0 {
		l.errorf(v, "%s: must be greater than 0", ctx)
		return false
	}
	return true
}

// locationSetting parses one inheritable location-level key into s.
func (l *loader) locationSetting(e kv, ctx string, s *locationSettings) bool {
	c := ctx + "." + e.key
	switch e.key {
	case "limit":
		names, ns, ok := l.strList(e.v, c)
		if !ok {
			return true
		}
		refs := make([]nameRef, len(names))
		for i := range names {
			refs[i] = nameRef{name: names[i], node: ns[i]}
		}
		s.limit = &refs
	case "guard":
		if gs, ok := l.guards(e.v, c); ok {
			s.guard = &gs
		}
	case "label":
		t := l.template(e.v, c, MaxLabelLen, false)
		if t != nil && t.Static() && t.StaticLen() == 0 {
			t = nil // explicit empty label: none
		} else if t == nil {
			return true
		}
		s.label = &t
		s.labelAt = e.v
	case "report":
		if name, ok := l.str(e.v, c); ok {
			s.report = &nameRef{name: name, node: e.v}
		}
	case "mode":
		if m, ok := l.str(e.v, c); ok {
			switch m {
			case "enforce":
				v := ModeEnforce
				s.mode = &v
			case "shadow":
				v := ModeShadow
				s.mode = &v
			default:
				l.errorf(e.v, "%s: want enforce or shadow, got %q", c, short(m))
			}
		}
	case "deny":
		pairs, ok := l.mapping(e.v, c, "status", "format", "grpc_status", "guard_retry_after", "guard_probe")
		if !ok {
			return true
		}
		for _, f := range pairs {
			switch f.key {
			case "status":
				if n, ok := l.integer(f.v, c+".status", 400, 599); ok {
					s.settings.denyStatus = &n
				}
			case "grpc_status":
				if n, ok := l.integer(f.v, c+".grpc_status", 1, 16); ok {
					s.settings.denyGRPCStatus = &n
				}
			case "guard_retry_after":
				if d, ok := l.duration(f.v, c+".guard_retry_after", time.Second, time.Hour); ok {
					if d%time.Second != 0 {
						l.errorf(f.v, "%s.guard_retry_after: %s is not whole seconds (Retry-After is)", c, d)
						continue
					}
					s.settings.guardRetryAfter = &d
				}
			case "guard_probe":
				if r, p, ok := l.rate(f.v, c+".guard_probe"); ok {
					s.settings.guardProbe = &probeRate{Rate: r, PeriodMs: p}
				}
			case "format":
				if m, ok := l.str(f.v, c+".format"); ok {
					switch m {
					case "json":
						v := DenyJSON
						s.settings.denyFormat = &v
					case "text":
						v := DenyText
						s.settings.denyFormat = &v
					default:
						l.errorf(f.v, "%s.format: want json or text, got %q", c, short(m))
					}
				}
			}
		}
	default:
		return false
	}
	return true
}

// guards parses a location's guard list ({tracker, threshold} items).
func (l *loader) guards(v *yaml.Node, c string) ([]rawGuard, bool) {
	items, ok := l.list(v, c)
	if !ok {
		return nil, false
	}
	gs := []rawGuard{}
	for i, it := range items {
		gc := fmt.Sprintf("%s[%d]", c, i)
		pairs, ok := l.mapping(it, gc, "tracker", "threshold")
		if !ok {
			continue
		}
		g := rawGuard{node: it}
		good := true
		for _, f := range pairs {
			switch f.key {
			case "tracker":
				if name, ok := l.str(f.v, gc+".tracker"); ok {
					g.tracker = nameRef{name: name, node: f.v}
				} else {
					good = false
				}
			case "threshold":
				if tv, isTier, ok := l.tierRef(f.v, gc+".threshold", numThreshold); isTier {
					g.thresholdTier, good = tv, good && ok
					continue
				}
				d, ok := l.wholeMs(f.v, gc+".threshold")
				g.threshold, good = d, good && ok
			}
		}
		if !hasKey(pairs, "tracker") {
			l.errorf(it, "%s: missing tracker", gc)
			good = false
		}
		if !hasKey(pairs, "threshold") {
			l.errorf(it, "%s: missing threshold", gc)
			good = false
		}
		if g.tracker.node != nil {
			g.bad = !good
			gs = append(gs, g)
		}
	}
	return gs, true
}
