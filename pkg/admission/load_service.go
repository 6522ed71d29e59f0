package admission

import (
	"fmt"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"gopkg.in/yaml.v3"
)

// pick returns the first set value: location, then service, then defaults.
func pick[T any](def T, layers ...*T) T {
	for _, v := range layers {
		if v != nil {
			return *v
		}
	}
	return def
}

func (l *loader) service(idx int, n *yaml.Node, defSvc *serviceSettings, defLoc *locationSettings) {
	ctx := fmt.Sprintf("services[%d]", idx)
	svc := &Service{Line: n.Line}
	if n.Kind == yaml.MappingNode { // the name first, for better messages
		for i := 0; i+1 < len(n.Content); i += 2 {
			if n.Content[i].Value == "name" {
				if v := n.Content[i+1]; v.Kind == yaml.ScalarNode && v.Tag == "!!str" && isName(v.Value) {
					ctx = fmt.Sprintf("services[%d] (%s)", idx, v.Value)
				}
				break
			}
		}
	}
	pairs, ok := l.mapping(n, ctx, concat(serviceOwnKeys, protocolKeys, serviceSetKeys, locationSetKeys)...)
	if !ok {
		return
	}
	var own serviceSettings
	var ownLoc locationSettings
	var portNode, listenNode, prefixesNode, locationsNode *yaml.Node
	for _, e := range pairs {
		c := ctx + "." + e.key
		switch e.key {
		case "name":
			if s, ok := l.name(e.v, c); ok {
				svc.Name = s
			}
		case "port":
			portNode = e.v
			if p, ok := l.integer(e.v, c, 1, 65535); ok {
				svc.Port = uint16(p)
			}
		case "prefixes":
			prefixesNode = e.v
			ss, ns, _ := l.strList(e.v, c)
			for i, s := range ss {
				pf, err := netip.ParsePrefix(s)
				if err != nil {
					l.errorf(ns[i], "%s: want a CIDR prefix such as 10.0.0.0/8, got %q", c, short(s))
					continue
				}
				svc.Prefixes = append(svc.Prefixes, netip.PrefixFrom(pf.Addr().Unmap(), pf.Bits()-unmapBits(pf)).Masked())
			}
		case "listen":
			listenNode = e.v
			ss, ns, _ := l.strList(e.v, c)
			if len(ss) == 0 && len(ns) == 0 && e.v.Kind == yaml.SequenceNode {
				l.errorf(e.v, "%s: empty list", c)
			}
			for i, s := range ss {
				ap, err := netip.ParseAddrPort(s)
				if err != nil || ap.Port() == 0 || ap.Addr().Zone() != "" {
					l.errorf(ns[i], "%s: want IP:port such as 127.0.0.1:8080 or [::1]:8080, got %q", c, short(s))
					continue
				}
				svc.Listen = append(svc.Listen, netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port()))
			}
		case "upstream":
			if s, ok := l.hostPort(e.v, c); ok {
				svc.Upstream = s
			}
		case "locations":
			locationsNode = e.v
		default:
			if !l.protocolKey(e, ctx, svc) && !l.serviceSetting(e, ctx, &own) {
				l.locationSetting(e, ctx, &ownLoc)
			}
		}
	}
	if svc.Name == "" && !hasKey(pairs, "name") {
		l.errorf(n, "%s: missing name", ctx)
	}
	switch {
	case portNode != nil && listenNode != nil:
		l.errorf(listenNode, "%s: set either port (steered) or listen (listener mode), not both", ctx)
	case portNode == nil && listenNode == nil:
		l.errorf(n, "%s: set port (steered by sk_lookup) or listen (listener mode)", ctx)
	}
	if prefixesNode != nil && listenNode != nil {
		l.errorf(prefixesNode, "%s: prefixes apply to steered services (port), not to listen", ctx)
	}
	if svc.Upstream == "" && !hasKey(pairs, "upstream") {
		l.errorf(n, "%s: missing upstream (host:port of the real service)", ctx)
	}
	inheritServiceSettings(svc, &own, defSvc, &ownLoc, defLoc)

	if locationsNode == nil {
		// A service without locations protects all of its traffic with
		// the service-level settings: one implicit catch-all location.
		loc := &Location{Service: svc, Name: implicitLocationName, Line: n.Line}
		l.resolveLocation(loc, ctx+".(implicit location)", n, &locationSettings{}, &ownLoc, defLoc)
		svc.Locations = append(svc.Locations, loc)
	} else if items, ok := l.list(locationsNode, ctx+".locations"); ok {
		names := map[string]int{}
		for i, it := range items {
			loc := l.location(svc, i, it, ctx, &ownLoc, defLoc)
			if loc == nil {
				continue
			}
			if prev, dup := names[loc.Name]; dup {
				l.errorf(it, "%s.locations[%d]: duplicate location name %q (first at line %d)", ctx, i, loc.Name, prev)
			}
			names[loc.Name] = it.Line
			svc.Locations = append(svc.Locations, loc)
		}
	}
	svc.IndexLocations()
	l.checkProtocols(svc, n, ctx)
	l.p.Services = append(l.p.Services, svc)
}

// inheritServiceSettings resolves the service-level settings: the
// service's own, else the defaults', else the built-in ones.
func inheritServiceSettings(svc *Service, own, defSvc *serviceSettings, ownLoc, defLoc *locationSettings) {
	svc.Forward = ForwardHeaders{
		XForwardedFor:   pick(false, own.xff, defSvc.xff),
		XForwardedProto: pick(false, own.xfp, defSvc.xfp),
		Forwarded:       pick(false, own.fwd, defSvc.fwd),
		XRealIP:         pick(false, own.xri, defSvc.xri),
	}
	svc.Timeouts = Timeouts{
		Header:    pick(DefaultHeaderTimeout, own.headerTimeout, defSvc.headerTimeout),
		Idle:      pick(DefaultIdleTimeout, own.idleTimeout, defSvc.idleTimeout),
		Upstream:  pick(DefaultUpstreamTimeout, own.upstreamTimeout, defSvc.upstreamTimeout),
		Admission: pick(DefaultAdmissionTimeout, own.admissionTimeout, defSvc.admissionTimeout),
	}
	svc.Limits = Limits{
		MaxRequestLine:     int(pick(DefaultMaxRequestLine, own.maxRequestLine, defSvc.maxRequestLine)),
		MaxHeaderBytes:     int(pick(DefaultMaxHeaderBytes, own.maxHeaderBytes, defSvc.maxHeaderBytes)),
		MaxHeaders:         int(pick(DefaultMaxHeaders, own.maxHeaders, defSvc.maxHeaders)),
		MaxBodyBytes:       pick(0, own.maxBodyBytes, defSvc.maxBodyBytes),
		MaxRequestsPerConn: int(pick(0, own.maxRequestsPerConn, defSvc.maxRequestsPerConn)),
	}
	svc.RateLimitHeaders = pick(DefaultRateLimitHeaders, own.rateLimitHeaders, defSvc.rateLimitHeaders)
	svc.SteerLoopback = pick(DefaultSteerLoopback, own.steerLoopback, defSvc.steerLoopback)
	svc.ClientAddress = own.clientAddr
	if svc.ClientAddress == nil {
		svc.ClientAddress = defSvc.clientAddr
	}
	svc.Deny = Deny{
		Status:          int(pick(int64(DefaultDenyStatus), ownLoc.settings.denyStatus, defLoc.settings.denyStatus)),
		Format:          pick(DenyJSON, ownLoc.settings.denyFormat, defLoc.settings.denyFormat),
		GRPCStatus:      int(pick(int64(DefaultDenyGRPCStatus), ownLoc.settings.denyGRPCStatus, defLoc.settings.denyGRPCStatus)),
		GuardRetryAfter: pick(DefaultGuardRetryAfter, ownLoc.settings.guardRetryAfter, defLoc.settings.guardRetryAfter),
	}
	svc.UpstreamProtocol = pick(UpstreamAuto, own.upstreamProtocol, defSvc.upstreamProtocol)
	svc.EscapedSlashes = pick(EscapedSlashesReject, own.escapedSlashes, defSvc.escapedSlashes)
	svc.H2 = own.h2.resolve(&defSvc.h2)
}

// unmapBits is the prefix-length adjustment when an IPv4-mapped IPv6
// prefix is written (::ffff:10.0.0.0/104 -> 10.0.0.0/8).
func unmapBits(p netip.Prefix) int {
	if p.Addr().Is4In6() && p.Bits() >= 96 {
		return 96
	}
	return 0
}

func (l *loader) location(svc *Service, idx int, n *yaml.Node, svcCtx string, svcLoc, defLoc *locationSettings) *Location {
	ctx := fmt.Sprintf("%s.locations[%d]", svcCtx, idx)
	pairs, ok := l.mapping(n, ctx, concat(locationOwnKeys, locationSetKeys)...)
	if !ok {
		return nil
	}
	loc := &Location{Service: svc, Index: idx, Name: strconv.Itoa(idx), Line: n.Line}
	var own locationSettings
	for _, e := range pairs {
		c := ctx + "." + e.key
		switch e.key {
		case "name":
			if s, ok := l.name(e.v, c); ok {
				loc.Name = s
			}
		case "match":
			l.match(e.v, c, &loc.Match)
		default:
			l.locationSetting(e, ctx, &own)
		}
	}
	l.resolveLocation(loc, ctx, n, &own, svcLoc, defLoc)
	return loc
}

// resolveLocation applies inheritance (location, then service, then
// top-level defaults, then built-in defaults) and resolves zone and
// tracker names.
func (l *loader) resolveLocation(loc *Location, ctx string, n *yaml.Node, own, svc, def *locationSettings) {
	layers := []*locationSettings{own, svc, def}
	for _, s := range layers {
		if s.limit != nil {
			seen := map[string]bool{}
			loc.Limits = []*Zone{}
			for _, r := range *s.limit {
				z := l.p.zoneByName[r.name]
				switch {
				case z == nil:
					l.refErrorf(r.node, "%s: limit: unknown zone %q%s", ctx, short(r.name), l.inherited(s, own))
				case seen[r.name]:
					l.errorf(r.node, "%s: limit: zone %q listed twice", ctx, r.name)
				default:
					seen[r.name] = true
					loc.Limits = append(loc.Limits, z)
				}
			}
			break
		}
	}
	for _, s := range layers {
		if s.guard != nil {
			seen := map[string]bool{}
			for _, g := range *s.guard {
				t := l.p.trackerByName[g.tracker.name]
				switch {
				case t == nil:
					l.refErrorf(g.tracker.node, "%s: guard: unknown tracker %q%s", ctx, short(g.tracker.name), l.inherited(s, own))
				case seen[t.Name]:
					l.errorf(g.tracker.node, "%s: guard: tracker %q guarded twice", ctx, t.Name)
				case g.bad:
				default:
					seen[t.Name] = true
					loc.Guards = append(loc.Guards, Guard{Tracker: t, Threshold: g.threshold, ThresholdMs: uint32(g.threshold / time.Millisecond), ThresholdTier: g.thresholdTier})
				}
			}
			break
		}
	}
	for _, s := range layers {
		if s.label != nil {
			loc.Label = *s.label
			break
		}
	}
	for _, s := range layers {
		if s.report != nil {
			if s.report.name != "" {
				loc.Report = l.p.trackerByName[s.report.name]
				if loc.Report == nil {
					l.refErrorf(s.report.node, "%s: report: unknown tracker %q%s", ctx, short(s.report.name), l.inherited(s, own))
				}
			}
			break
		}
	}
	loc.Mode = pick(ModeEnforce, own.mode, svc.mode, def.mode)
	loc.Deny = Deny{
		Status:          int(pick(int64(DefaultDenyStatus), own.settings.denyStatus, svc.settings.denyStatus, def.settings.denyStatus)),
		Format:          pick(DenyJSON, own.settings.denyFormat, svc.settings.denyFormat, def.settings.denyFormat),
		GRPCStatus:      int(pick(int64(DefaultDenyGRPCStatus), own.settings.denyGRPCStatus, svc.settings.denyGRPCStatus, def.settings.denyGRPCStatus)),
		GuardRetryAfter: pick(DefaultGuardRetryAfter, own.settings.guardRetryAfter, svc.settings.guardRetryAfter, def.settings.guardRetryAfter),
	}
	if pr := pick(probeRate{}, own.settings.guardProbe, svc.settings.guardProbe, def.settings.guardProbe); pr.Rate > 0 {
		loc.GuardProbe = newGuardProbe(pr)
	}
	if len(loc.Limits) > MaxPerRequest {
		l.errorf(n, "%s: %d zones, more than the %d resources a request can carry", ctx, len(loc.Limits), MaxPerRequest)
	}
	if len(loc.Guards) > MaxPerRequest {
		l.errorf(n, "%s: %d guards, more than the %d a request can carry", ctx, len(loc.Guards), MaxPerRequest)
	}
	if loc.Protected() {
		if size := minDatagram(loc); size > MaxDatagram {
			l.errorf(n, "%s: the rate request needs at least %d bytes, over the %d-byte datagram limit (fewer zones/guards or shorter templates)", ctx, size, MaxDatagram)
		}
	}
}

// refErrorf reports a bad reference once, even when several locations
// inherit it from the same service or defaults entry.
func (l *loader) refErrorf(n *yaml.Node, format string, args ...any) {
	if l.reported == nil {
		l.reported = map[*yaml.Node]bool{}
	}
	if l.reported[n] {
		return
	}
	l.reported[n] = true
	l.errorf(n, format, args...)
}

// inherited explains where an inherited bad reference came from: the
// error is reported at the defining line, once per location using it.
func (l *loader) inherited(s, own *locationSettings) string {
	if s == own {
		return ""
	}
	return " (inherited)"
}

// minDatagram is a lower bound of the sealed COMPLETION datagram (the
// largest a request produces) from the templates' literal lengths.
func minDatagram(loc *Location) int {
	n := wireHeaderAndTag + wireRequestFixed + wireStringOverhead
	if loc.Label != nil {
		n += loc.Label.StaticLen()
	}
	for _, g := range loc.Guards {
		n += wireStringOverhead + wireGuardFixed + g.Tracker.Service.StaticLen()
	}
	for _, z := range loc.Limits {
		n += wireStringOverhead + wireResourceFixed + z.Bucket.StaticLen()
	}
	return n
}

func (l *loader) match(n *yaml.Node, ctx string, m *Match) {
	pairs, ok := l.mapping(n, ctx, "host", "path", "path_prefix", "methods", "headers", "sni")
	if !ok {
		return
	}
	var pathNode, prefixNode *yaml.Node
	for _, e := range pairs {
		c := ctx + "." + e.key
		switch e.key {
		case "host", "sni":
			hs, ns, _ := l.strList(e.v, c)
			for i, h := range hs {
				h = strings.ToLower(strings.TrimSuffix(h, "."))
				if !validHostPattern(h) {
					l.errorf(ns[i], "%s: bad %s %q: want a DNS name, an IP address or *.domain", c, e.key, short(hs[i]))
					continue
				}
				if e.key == "sni" {
					m.SNI = append(m.SNI, h)
				} else {
					m.Hosts = append(m.Hosts, h)
				}
			}
		case "path":
			pathNode = e.v
			if s, ok := l.str(e.v, c); ok {
				if !strings.HasPrefix(s, "/") {
					l.errorf(e.v, "%s: must start with /", c)
				} else {
					m.Path = s
				}
			}
		case "path_prefix":
			prefixNode = e.v
			if s, ok := l.str(e.v, c); ok {
				if !strings.HasPrefix(s, "/") {
					l.errorf(e.v, "%s: must start with /", c)
				} else {
					m.PathPrefix = s
				}
			}
		case "methods":
			ms, ns, _ := l.strList(e.v, c)
			for i, meth := range ms {
				if !isToken(meth) || strings.ToUpper(meth) != meth {
					l.errorf(ns[i], "%s: bad method %q: methods are case-sensitive upper-case tokens such as GET", c, short(meth))
					continue
				}
				m.Methods = append(m.Methods, meth)
			}
		case "headers":
			l.matchHeaders(e.v, c, m)
		}
	}
	if pathNode != nil && prefixNode != nil {
		l.errorf(prefixNode, "%s: set path or path_prefix, not both", ctx)
	}
}

func (l *loader) matchHeaders(n *yaml.Node, ctx string, m *Match) {
	if l.alias(n, ctx) {
		return
	}
	if n.Kind != yaml.MappingNode {
		l.errorf(n, "%s: want a mapping of header name to true (present), false (absent) or a string (exact value), got %s", ctx, kindName(n))
		return
	}
	seen := map[string]bool{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		if k.Kind != yaml.ScalarNode || !isToken(k.Value) {
			l.errorf(k, "%s: bad header name %q", ctx, short(k.Value))
			continue
		}
		name := strings.ToLower(k.Value)
		if seen[name] {
			l.errorf(k, "%s: header %q listed twice", ctx, k.Value)
			continue
		}
		seen[name] = true
		c := ctx + "." + k.Value
		switch {
		case v.Kind == yaml.ScalarNode && v.Tag == "!!bool":
			if b, ok := l.boolean(v, c); ok {
				m.Headers = append(m.Headers, HeaderCondition{Name: name, Present: *b})
			}
		case v.Kind == yaml.ScalarNode && v.Tag == "!!str":
			m.Headers = append(m.Headers, HeaderCondition{Name: name, Present: true, HasValue: true, Value: v.Value})
		default:
			l.errorf(v, "%s: want true (present), false (absent) or a string (exact value), got %s", c, kindName(v))
		}
	}
}

func validHostPattern(h string) bool {
	if rest, ok := strings.CutPrefix(h, "*."); ok {
		return isDNSName(rest)
	}
	if strings.HasPrefix(h, "[") && strings.HasSuffix(h, "]") {
		a, err := netip.ParseAddr(h[1 : len(h)-1])
		return err == nil && a.Is6()
	}
	return isDNSName(h)
}

// crossChecks validates relations between services once all are parsed.
func (l *loader) crossChecks() {
	p := l.p
	names := map[string]*Service{}
	type bound struct {
		ap  netip.AddrPort
		svc *Service
	}
	var listens []bound
	for _, s := range p.Services {
		if s.Name != "" {
			if prev := names[s.Name]; prev != nil {
				l.errs = append(l.errs, Error{File: l.file, Line: s.Line, Msg: fmt.Sprintf("services: duplicate service name %q (first at line %d)", s.Name, prev.Line)})
			} else {
				names[s.Name] = s
			}
		}
		for _, ap := range s.Listen {
			for _, b := range listens {
				if b.ap.Port() == ap.Port() && (b.ap.Addr() == ap.Addr() || b.ap.Addr().IsUnspecified() || ap.Addr().IsUnspecified()) {
					l.errs = append(l.errs, Error{File: l.file, Line: s.Line, Msg: fmt.Sprintf("services (%s): listen %s conflicts with %s of service %q", s.Name, ap, b.ap, b.svc.Name)})
				}
			}
			listens = append(listens, bound{ap, s})
			p.listeners = append(p.listeners, listenerRoute{addr: ap, svc: s})
		}
		if s.Steered() {
			for _, o := range p.steered {
				if o.Port == s.Port && prefixesOverlap(o.Prefixes, s.Prefixes) {
					l.errs = append(l.errs, Error{File: l.file, Line: s.Line, Msg: fmt.Sprintf("services (%s): port %d is already steered to service %q for an overlapping destination (add disjoint prefixes)", s.Name, s.Port, o.Name)})
				}
			}
			p.steered = append(p.steered, s)
		}
	}
	// An upstream that is one of the proxy's own listeners would loop.
	for _, s := range p.Services {
		host, port, err := splitHostPort(s.Upstream)
		if err != nil {
			continue
		}
		a, err := netip.ParseAddr(host)
		if err != nil {
			continue
		}
		a = a.Unmap()
		for _, b := range listens {
			if b.ap.Port() == port && (b.ap.Addr() == a || b.ap.Addr().IsUnspecified() && (a.IsLoopback() || a.IsUnspecified())) {
				l.errs = append(l.errs, Error{File: l.file, Line: s.Line, Msg: fmt.Sprintf("services (%s): upstream %s is the proxy's own listener of service %q: requests would loop", s.Name, s.Upstream, b.svc.Name)})
			}
		}
	}
}

func prefixesOverlap(a, b []netip.Prefix) bool {
	if len(a) == 0 || len(b) == 0 {
		return true
	}
	for _, x := range a {
		for _, y := range b {
			if x.Overlaps(y) {
				return true
			}
		}
	}
	return false
}
