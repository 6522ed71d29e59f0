package admission

import (
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/rl-tproxy/rl-tproxy/pkg/ratelimitly"
	"github.com/rl-tproxy/rl-tproxy/pkg/ratelimitly/credentials"
)

// Static limits of rendered values (the wire and the nginx contract).
const (
	MaxBucketLen  = 1024 // zone bucket and tracker service
	MaxLabelLen   = 256
	MaxPerRequest = 32 // guards and resources per request (wire counts)
	MaxDatagram   = 1400
	maxFileSize   = 4 << 20
)

// Built-in defaults of inheritable settings.
const (
	DefaultHeaderTimeout      = 10 * time.Second
	DefaultIdleTimeout        = 60 * time.Second
	DefaultUpstreamTimeout    = 30 * time.Second
	DefaultResolverTimeout    = 2 * time.Second
	DefaultMaxRequestLine     = 8 << 10
	DefaultMaxHeaderBytes     = 16 << 10
	DefaultMaxHeaders         = 100
	DefaultRateLimitHeaders   = true
	DefaultSteerLoopback      = true
	implicitLocationName      = "*"
	embeddedTenant            = "embedded"
	embeddedKeyID             = 1
	wireHeaderAndTag          = 52 + 16
	wireStringOverhead        = 2
	wireGuardFixed            = 4
	wireResourceFixed         = 16
	wireRequestFixed          = 2 + 1 // two counts, completion decision byte
	maxDuration               = 24 * time.Hour
	defaultLocationNameLength = 64
)

// Load reads, validates and compiles the policy file at path. Invalid
// files return a *LoadError listing every problem as FILE:LINE: message.
// A relative credentials path is resolved against the policy's directory.
func Load(path string) (*Policy, error) {
	data, err := readLimited(path)
	if err != nil {
		return nil, fmt.Errorf("load policy %s: %w", path, err)
	}
	return Parse(path, data)
}

// Parse validates and compiles policy text; name is the file name used in
// errors and as the base for a relative credentials path.
func Parse(name string, data []byte) (*Policy, error) {
	return parse(name, data, readLimited)
}

// readLimited reads a regular file of bounded size (never a device or FIFO
// that could block or never end).
func readLimited(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !st.Mode().IsRegular() {
		return nil, fmt.Errorf("%s is not a regular file", path)
	}
	data, err := io.ReadAll(io.LimitReader(f, maxFileSize+1))
	if err != nil {
		return nil, err
	}
	if len(data) > maxFileSize {
		return nil, fmt.Errorf("%s is larger than %d bytes", path, maxFileSize)
	}
	return data, nil
}

type loader struct {
	nodes
	dir      string
	readFile func(string) ([]byte, error)
	p        *Policy
	reported map[*yaml.Node]bool // references already reported (refErrorf)
}

// serviceSettings are the inheritable service-level settings; nil = unset.
type serviceSettings struct {
	xff, xfp, fwd, xri                          *bool
	headerTimeout, idleTimeout, upstreamTimeout *time.Duration
	maxRequestLine, maxHeaderBytes, maxHeaders  *int64
	maxBodyBytes, maxRequestsPerConn            *int64
	rateLimitHeaders, steerLoopback             *bool
	denyStatus                                  *int64
	denyFormat                                  *DenyFormat
}

type nameRef struct {
	name string
	node *yaml.Node
}

type rawGuard struct {
	tracker   nameRef
	threshold time.Duration
	node      *yaml.Node
	bad       bool // an error was reported; resolve the tracker name only
}

// locationSettings are the inheritable location-level settings; nil =
// unset, a non-nil empty value = explicitly none.
type locationSettings struct {
	limit    *[]nameRef
	guard    *[]rawGuard
	label    **Template // non-nil; *label == nil means explicitly no label
	labelAt  *yaml.Node
	report   *nameRef // name "" = explicitly no report
	mode     *Mode
	settings serviceSettings // only deny status/format are used at location level
}

var (
	topKeys         = []string{"ratelimitly", "defaults", "zones", "trackers", "services", "request_id"}
	rlKeys          = []string{"srv", "embedded", "resolver", "resolver_timeout", "credentials", "request_policy", "fail", "bind", "debug"}
	rpKeys          = []string{"name", "unit", "replay_gaps", "replays", "final_receive", "completion"}
	serviceSetKeys  = []string{"forwarded_headers", "timeouts", "limits", "ratelimit_headers", "steer_loopback"}
	locationSetKeys = []string{"limit", "guard", "label", "report", "mode", "deny"}
	serviceOwnKeys  = []string{"name", "port", "prefixes", "listen", "upstream", "locations"}
	locationOwnKeys = []string{"name", "match"}
)

func concat(lists ...[]string) []string {
	var out []string
	for _, l := range lists {
		out = append(out, l...)
	}
	return out
}

func parse(name string, data []byte, readFile func(string) ([]byte, error)) (*Policy, error) {
	l := &loader{nodes: nodes{file: name}, dir: filepath.Dir(name), readFile: readFile}
	l.p = &Policy{File: name, zoneByName: map[string]*Zone{}, trackerByName: map[string]*Tracker{}}
	l.load(data)
	if len(l.errs) > 0 {
		l.sortErrs()
		return nil, &LoadError{Errs: l.errs}
	}
	return l.p, nil
}

func (l *loader) load(data []byte) {
	dec := yaml.NewDecoder(strings.NewReader(string(data)))
	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil {
		line, msg := yamlSyntax(err)
		l.errs = append(l.errs, Error{File: l.file, Line: line, Msg: msg})
		return
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); err == nil {
		l.errorf(&extra, "more than one YAML document; a policy is one document")
	} else if !errors.Is(err, io.EOF) {
		line, msg := yamlSyntax(err)
		l.errs = append(l.errs, Error{File: l.file, Line: line, Msg: msg})
	}
	root := &doc
	if root.Kind == yaml.DocumentNode && len(root.Content) == 1 {
		root = root.Content[0]
	}
	pairs, ok := l.mapping(root, "policy", topKeys...)
	if !ok {
		return
	}
	var rlNode, defaultsNode, zonesNode, trackersNode, servicesNode, ridNode *yaml.Node
	for _, e := range pairs {
		switch e.key {
		case "request_id":
			ridNode = e.v
		case "ratelimitly":
			rlNode = e.v
		case "defaults":
			defaultsNode = e.v
		case "zones":
			zonesNode = e.v
		case "trackers":
			trackersNode = e.v
		case "services":
			servicesNode = e.v
		}
	}
	if rlNode == nil {
		l.errorf(root, "missing ratelimitly block (srv or embedded: true)")
	} else {
		l.ratelimitly(rlNode)
	}
	l.requestID(ridNode)
	if zonesNode != nil {
		l.zones(zonesNode)
	}
	if trackersNode != nil {
		l.trackers(trackersNode)
	}
	var defSvc serviceSettings
	var defLoc locationSettings
	if defaultsNode != nil {
		if pairs, ok := l.mapping(defaultsNode, "defaults", concat(serviceSetKeys, locationSetKeys)...); ok {
			for _, e := range pairs {
				if !l.serviceSetting(e, "defaults", &defSvc) {
					l.locationSetting(e, "defaults", &defLoc)
				}
			}
		}
	}
	if servicesNode == nil {
		l.errorf(root, "missing services: at least one service is required")
		return
	}
	items, ok := l.list(servicesNode, "services")
	if !ok {
		return
	}
	if len(items) == 0 {
		l.errorf(servicesNode, "services: at least one service is required")
	}
	for i, n := range items {
		l.service(i, n, &defSvc, &defLoc)
	}
	l.crossChecks()
}

func (l *loader) ratelimitly(n *yaml.Node) {
	pairs, ok := l.mapping(n, "ratelimitly", rlKeys...)
	if !ok {
		return
	}
	rl := &l.p.RateLimitly
	rl.ResolverTimeout = DefaultResolverTimeout
	rl.RequestPolicy = ratelimitly.Standard(DefaultUnit)
	var credNode, rpNode, embeddedNode, resolverNode, resolverTimeoutNode *yaml.Node
	targetBad := false // srv or embedded was written but invalid (already reported)
	for _, e := range pairs {
		ctx := "ratelimitly." + e.key
		switch e.key {
		case "srv":
			s, ok := l.str(e.v, ctx)
			switch {
			case !ok:
				targetBad = true
			case !isDNSName(s):
				l.errorf(e.v, "%s: bad SRV name %q", ctx, short(s))
				targetBad = true
			default:
				rl.SRV = s
			}
		case "embedded":
			embeddedNode = e.v
			if b, ok := l.boolean(e.v, ctx); ok {
				rl.Embedded = *b
			} else {
				targetBad = true
			}
		case "resolver":
			resolverNode = e.v
			if s, ok := l.str(e.v, ctx); ok {
				rl.Resolver = l.resolverAddr(e.v, ctx, s)
			}
		case "resolver_timeout":
			resolverTimeoutNode = e.v
			if d, ok := l.duration(e.v, ctx, time.Millisecond, time.Minute); ok {
				rl.ResolverTimeout = d
			}
		case "credentials":
			credNode = e.v
			if s, ok := l.str(e.v, ctx); ok {
				if s == "" {
					l.errorf(e.v, "%s: empty path", ctx)
				} else {
					rl.CredentialsFile = s
					if !filepath.IsAbs(s) {
						rl.CredentialsFile = filepath.Join(l.dir, s)
					}
				}
			}
		case "request_policy":
			rpNode = e.v
			l.requestPolicy(e.v, &rl.RequestPolicy)
		case "fail":
			if s, ok := l.str(e.v, ctx); ok {
				switch s {
				case "open":
					rl.Fail = FailOpen
				case "close":
					rl.Fail = FailClose
				case "local":
					rl.Fail = FailLocal
				default:
					l.errorf(e.v, "%s: want open, close or local, got %q", ctx, short(s))
				}
			}
		case "bind":
			if s, ok := l.str(e.v, ctx); ok {
				a, err := netip.ParseAddr(s)
				if err != nil || a.Zone() != "" {
					l.errorf(e.v, "%s: want an IP address, got %q", ctx, short(s))
				} else {
					rl.Bind = a.Unmap()
				}
			}
		case "debug":
			if b, ok := l.boolean(e.v, ctx); ok {
				rl.Debug = *b
			}
		}
	}
	switch {
	case rl.SRV != "" && rl.Embedded:
		l.errorf(embeddedNode, "ratelimitly: set either srv or embedded: true, not both")
	case rl.SRV == "" && !rl.Embedded && !targetBad:
		l.errorf(n, "ratelimitly: set srv (the RateLimitly SRV name) or embedded: true")
	}
	if rl.Embedded {
		for _, x := range []*yaml.Node{resolverNode, resolverTimeoutNode} {
			if x != nil {
				l.errorf(x, "ratelimitly: resolver settings apply to srv discovery, not to embedded: true")
			}
		}
	}
	l.credentials(n, credNode)
	l.checkHorizon(n, rpNode)
}

func (l *loader) resolverAddr(v *yaml.Node, ctx, s string) string {
	if a, err := netip.ParseAddr(s); err == nil && a.Zone() == "" {
		return netip.AddrPortFrom(a, 53).String()
	}
	ap, err := netip.ParseAddrPort(s)
	if err != nil || ap.Port() == 0 || ap.Addr().Zone() != "" {
		l.errorf(v, "%s: want IP or IP:port (such as 10.96.0.10:53), got %q", ctx, short(s))
		return ""
	}
	return ap.String()
}

func (l *loader) requestPolicy(n *yaml.Node, out *RequestPolicy) {
	const ctx = "ratelimitly.request_policy"
	if n.Kind == yaml.ScalarNode && n.Tag == "!!str" { // shorthand: request_policy: standard
		switch n.Value {
		case PolicyStandard:
			*out = ratelimitly.Standard(DefaultUnit)
		case PolicySingleRound:
			*out = ratelimitly.SingleRound(DefaultUnit)
		default:
			l.errorf(n, "%s: want standard or single_round (custom needs a mapping), got %q", ctx, short(n.Value))
		}
		return
	}
	pairs, ok := l.mapping(n, ctx, rpKeys...)
	if !ok {
		return
	}
	name := PolicyStandard
	unit := DefaultUnit
	var custom []kv
	for _, e := range pairs {
		c := ctx + "." + e.key
		switch e.key {
		case "name":
			if s, ok := l.str(e.v, c); ok {
				switch s {
				case PolicyStandard, PolicySingleRound, PolicyCustom:
					name = s
				default:
					l.errorf(e.v, "%s: want standard, single_round or custom, got %q", c, short(s))
				}
			}
		case "unit":
			if d, ok := l.duration(e.v, c, time.Millisecond, WireMaxTTL); ok {
				unit = d
			}
		default:
			custom = append(custom, e)
		}
	}
	switch name {
	case PolicyStandard:
		*out = ratelimitly.Standard(unit)
	case PolicySingleRound:
		*out = ratelimitly.SingleRound(unit)
	case PolicyCustom:
		*out = RequestPolicy{Name: PolicyCustom, Unit: unit}
	}
	var gapsNode *yaml.Node
	for _, e := range custom {
		c := ctx + "." + e.key
		if name != PolicyCustom {
			l.errorf(e.k, "%s: only for name: custom (%s has a fixed schedule)", c, name)
			continue
		}
		switch e.key {
		case "replay_gaps":
			gapsNode = e.v
			items, ok := l.list(e.v, c)
			if !ok {
				continue
			}
			for i, it := range items {
				if d, ok := l.duration(it, fmt.Sprintf("%s[%d]", c, i), time.Millisecond, WireMaxTTL); ok {
					out.ReplayGaps = append(out.ReplayGaps, d)
				}
			}
		case "replays":
			if v, ok := l.integer(e.v, c, 0, MaxReplays); ok {
				out.Replays = int(v)
			}
		case "final_receive":
			if d, ok := l.duration(e.v, c, 0, WireMaxTTL); ok {
				out.FinalReceive = d
			}
		case "completion":
			if b, ok := l.boolean(e.v, c); ok {
				out.Completion = *b
			}
		}
	}
	if name == PolicyCustom && gapsNode != nil && len(out.ReplayGaps) > out.Replays {
		l.errorf(gapsNode, "%s: replay_gaps lists %d gaps but replays is %d", ctx, len(out.ReplayGaps), out.Replays)
	}
}

// credentials loads the credentials file, or generates a key for an
// embedded server when none is given.
func (l *loader) credentials(rlNode, credNode *yaml.Node) {
	rl := &l.p.RateLimitly
	if rl.CredentialsFile == "" {
		if credNode != nil { // present but invalid: already reported
			return
		}
		if !rl.Embedded {
			if rl.SRV != "" {
				l.errorf(rlNode, "ratelimitly: credentials is required with srv")
			}
			return
		}
		var c credentials.Credential
		c.Tenant = embeddedTenant
		c.KeyID = embeddedKeyID
		_, _ = rand.Read(c.Secret[:]) // never fails (crypto/rand, Go >= 1.24)
		rl.Credential = c
		rl.Credentials = []credentials.Credential{c}
		rl.GeneratedCredential = true
		return
	}
	data, err := l.readFile(rl.CredentialsFile)
	if err != nil {
		var pe *fs.PathError
		if errors.As(err, &pe) {
			err = pe.Err // the path is already in the message
		}
		l.errorf(credNode, "ratelimitly.credentials: cannot read %s: %v", rl.CredentialsFile, err)
		return
	}
	creds, err := credentials.Parse(rl.CredentialsFile, data)
	if err != nil {
		var le *credentials.LoadError
		if errors.As(err, &le) {
			l.errs = append(l.errs, le.Errs...)
		} else {
			l.errorf(credNode, "ratelimitly.credentials: %v", err)
		}
		l.errorf(credNode, "ratelimitly.credentials: %s is invalid (its errors are listed with its name)", rl.CredentialsFile)
		return
	}
	if !rl.Embedded && len(creds) != 1 {
		l.errorf(credNode, "ratelimitly.credentials: %s has %d keys; a client uses exactly one", rl.CredentialsFile, len(creds))
		return
	}
	rl.Credentials = creds
	rl.Credential = creds[0]
}

// checkHorizon validates the request policy's horizon against the wire TTL
// and the credential's max_horizon (ratelimitly.RequestPolicy.Validate).
func (l *loader) checkHorizon(rlNode, rpNode *yaml.Node) {
	rl := &l.p.RateLimitly
	at := rpNode
	if at == nil {
		at = rlNode
	}
	rl.Horizon = rl.RequestPolicy.Horizon()
	if err := rl.RequestPolicy.Validate(rl.Credential); err != nil {
		msg := "ratelimitly.request_policy: " + err.Error()
		if rl.Credential.MaxHorizon > 0 && rl.Horizon > rl.Credential.MaxHorizon {
			msg += fmt.Sprintf(" (credential key_id %d in %s)", rl.Credential.KeyID, rl.CredentialsFile)
		}
		l.errorf(at, "%s", msg)
	}
}

func (l *loader) zones(n *yaml.Node) {
	if l.alias(n, "zones") {
		return
	}
	if n.Kind != yaml.MappingNode {
		l.errorf(n, "zones: want a mapping of zone names, got %s", kindName(n))
		return
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		name, ok := l.name(k, "zones")
		if !ok {
			continue
		}
		ctx := "zones." + name
		if _, dup := l.p.zoneByName[name]; dup {
			l.errorf(k, "%s: duplicate zone", ctx)
			continue
		}
		pairs, ok := l.mapping(v, ctx, "bucket", "rate", "burst", "cost")
		if !ok {
			continue
		}
		z := &Zone{Name: name, Cost: 1, Line: k.Line}
		good := true
		var costNode *yaml.Node
		for _, e := range pairs {
			c := ctx + "." + e.key
			switch e.key {
			case "bucket":
				z.Bucket = l.template(e.v, c, MaxBucketLen, true)
				good = good && z.Bucket != nil
			case "rate":
				r, p, ok := l.rate(e.v, c)
				z.Rate, z.PeriodMs, good = r, p, good && ok
			case "burst":
				b, ok := l.integer(e.v, c, 0, math.MaxUint32)
				z.Burst, good = uint32(b), good && ok
			case "cost":
				costNode = e.v
				b, ok := l.integer(e.v, c, 1, math.MaxUint32)
				z.Cost, good = uint32(b), good && ok
			}
		}
		if z.Bucket == nil && !hasKey(pairs, "bucket") {
			l.errorf(v, "%s: missing bucket", ctx)
			good = false
		}
		if z.Rate == 0 && !hasKey(pairs, "rate") {
			l.errorf(v, "%s: missing rate", ctx)
			good = false
		}
		if good {
			capacity := z.Burst
			if capacity == 0 {
				capacity = z.Rate
			}
			if z.Cost > capacity {
				l.errorf(costNode, "%s: cost %d exceeds the bucket capacity %d (burst, or rate when burst is 0): no request could ever pass", ctx, z.Cost, capacity)
			}
		}
		l.p.zoneByName[name] = z
		l.p.Zones = append(l.p.Zones, z)
	}
}

func (l *loader) trackers(n *yaml.Node) {
	if l.alias(n, "trackers") {
		return
	}
	if n.Kind != yaml.MappingNode {
		l.errorf(n, "trackers: want a mapping of tracker names, got %s", kindName(n))
		return
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		name, ok := l.name(k, "trackers")
		if !ok {
			continue
		}
		ctx := "trackers." + name
		if _, dup := l.p.trackerByName[name]; dup {
			l.errorf(k, "%s: duplicate tracker", ctx)
			continue
		}
		pairs, ok := l.mapping(v, ctx, "service")
		if !ok {
			continue
		}
		t := &Tracker{Name: name, Line: k.Line}
		for _, e := range pairs {
			t.Service = l.template(e.v, ctx+".service", MaxBucketLen, true)
		}
		if !hasKey(pairs, "service") {
			l.errorf(v, "%s: missing service", ctx)
		}
		l.p.trackerByName[name] = t
		l.p.Trackers = append(l.p.Trackers, t)
	}
}

func hasKey(pairs []kv, key string) bool {
	for _, e := range pairs {
		if e.key == key {
			return true
		}
	}
	return false
}

// template compiles a template and applies the static limits: the literal
// part alone must fit max, and a required value must not be statically
// empty.
func (l *loader) template(v *yaml.Node, ctx string, max int, nonEmpty bool) *Template {
	s, ok := l.str(v, ctx)
	if !ok {
		return nil
	}
	t, err := CompileTemplate(s)
	if err != nil {
		l.errorf(v, "%s: %v", ctx, err)
		return nil
	}
	t.max, t.nonEmpty = max, nonEmpty
	switch {
	case t.StaticLen() > max && t.Static():
		l.errorf(v, "%s: static value is %d bytes, over the %d-byte limit", ctx, t.StaticLen(), max)
		return nil
	case t.StaticLen() > max:
		l.errorf(v, "%s: literal text is %d bytes, over the %d-byte limit before any variable", ctx, t.StaticLen(), max)
		return nil
	case nonEmpty && t.Static() && t.StaticLen() == 0:
		l.errorf(v, "%s: must not be empty", ctx)
		return nil
	}
	return t
}

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
		pairs, ok := l.mapping(e.v, c, "header", "idle", "upstream")
		if !ok {
			return true
		}
		for _, f := range pairs {
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
		pairs, ok := l.mapping(e.v, c, "max_request_line", "max_header_bytes", "max_headers", "max_body_bytes", "max_requests_per_conn")
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
			}
		}
	case "ratelimit_headers":
		if b, ok := l.boolean(e.v, c); ok {
			s.rateLimitHeaders = b
		}
	case "steer_loopback":
		if b, ok := l.boolean(e.v, c); ok {
			s.steerLoopback = b
		}
	default:
		return false
	}
	return true
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
		items, ok := l.list(e.v, c)
		if !ok {
			return true
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
					d, ok := l.duration(f.v, gc+".threshold", time.Millisecond, time.Duration(math.MaxUint32)*time.Millisecond)
					if ok && d%time.Millisecond != 0 {
						l.errorf(f.v, "%s.threshold: must be whole milliseconds, got %s", gc, d)
						ok = false
					}
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
		s.guard = &gs
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
		pairs, ok := l.mapping(e.v, c, "status", "format")
		if !ok {
			return true
		}
		for _, f := range pairs {
			switch f.key {
			case "status":
				if n, ok := l.integer(f.v, c+".status", 400, 599); ok {
					s.settings.denyStatus = &n
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
