package admission

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"strings"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/rl-tproxy/rl-tproxy/internal/safefile"
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
	DefaultHeaderTimeout   = 10 * time.Second
	DefaultIdleTimeout     = 60 * time.Second
	DefaultUpstreamTimeout = 30 * time.Second
	// DefaultAdmissionTimeout is timeouts.admission's default (the
	// proxy's own, proxy.DefaultAdmissionTimeout): above the wire's
	// longest request horizon (65535ms), so a check's failure policy
	// always answers first.
	DefaultAdmissionTimeout = 70 * time.Second
	// MaxAdmissionTimeout bounds timeouts.admission: no RateLimitly check
	// outlives the wire's 65535ms horizon, and a hook that has not
	// answered for this long holds a connection and its request for
	// nothing.
	MaxAdmissionTimeout       = 10 * time.Minute
	DefaultResolverTimeout    = 2 * time.Second
	DefaultMaxRequestLine     = 8 << 10
	DefaultMaxHeaderBytes     = 16 << 10
	DefaultMaxHeaders         = 100
	DefaultRateLimitHeaders   = RateLimitFieldsDeny
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
	return parse(name, data, nil)
}

// readLimited reads a regular file of bounded size (never a device or FIFO
// that could block or never end).
func readLimited(path string) ([]byte, error) { return safefile.Read(path, maxFileSize) }

// readCredentials reads the credentials file named at line: through
// l.readFile when set (tests), else as a secret (safefile.ReadSecret),
// keeping its warning.
func (l *loader) readCredentials(path string, line int) ([]byte, error) {
	if l.readFile != nil {
		data, err := l.readFile(path)
		l.credData = data
		return data, err
	}
	data, warning, err := safefile.ReadSecret(path, maxFileSize)
	if err == nil {
		l.credData = data
	}
	if warning != "" {
		l.p.Warnings = append(l.p.Warnings, Error{File: l.file, Line: line, Msg: "ratelimitly.credentials: " + warning})
	}
	return data, err
}

type loader struct {
	nodes
	dir      string
	readFile func(string) ([]byte, error)
	credData []byte // the credentials file's bytes as read (for Policy.sum)
	p        *Policy
	reported map[*yaml.Node]bool // references already reported (refErrorf)
	tierRaw  map[string]*rawTier
	tierUses map[tierUse]*TierValue // nil value: the use had errors (reported once)
}

// serviceSettings are the inheritable service-level settings; nil = unset.
type serviceSettings struct {
	xff, xfp, fwd, xri                          *bool
	headerTimeout, idleTimeout, upstreamTimeout *time.Duration
	admissionTimeout                            *time.Duration
	maxRequestLine, maxHeaderBytes, maxHeaders  *int64
	maxBodyBytes, maxRequestsPerConn            *int64
	steerLoopback                               *bool
	rateLimitHeaders                            *RateLimitFields
	clientAddr                                  *ClientAddress
	denyStatus                                  *int64
	denyFormat                                  *DenyFormat
	denyGRPCStatus                              *int64
	guardRetryAfter                             *time.Duration
	guardProbe                                  *probeRate
	upstreamProtocol                            *string
	escapedSlashes                              *string
	h2                                          h2Settings
}

type nameRef struct {
	name string
	node *yaml.Node
}

type rawGuard struct {
	tracker       nameRef
	threshold     time.Duration
	thresholdTier *TierValue
	node          *yaml.Node
	bad           bool // an error was reported; resolve the tracker name only
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
	topKeys         = []string{"ratelimitly", "defaults", "tiers", "zones", "trackers", "services", "request_id"}
	rlKeys          = []string{"srv", "embedded", "resolver", "resolver_timeout", "credentials", "request_policy", "fail", "invalid", "bind", "debug"}
	rpKeys          = []string{"name", "unit", "replay_gaps", "replays", "final_receive", "completion"}
	serviceSetKeys  = []string{"forwarded_headers", "timeouts", "limits", "ratelimit_headers", "steer_loopback", "upstream_protocol", "client_address", "escaped_slashes"}
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

// parse loads policy text; readFile reads the credentials file (nil: the
// real file, with the ownership and permission rules of safefile.ReadSecret).
func parse(name string, data []byte, readFile func(string) ([]byte, error)) (*Policy, error) {
	l := &loader{nodes: nodes{file: name}, dir: filepath.Dir(name), readFile: readFile,
		tierRaw: map[string]*rawTier{}, tierUses: map[tierUse]*TierValue{}}
	l.p = &Policy{File: name, zoneByName: map[string]*Zone{}, trackerByName: map[string]*Tracker{}, tierByName: map[string]*Tier{}}
	l.load(data)
	if len(l.errs) > 0 {
		l.sortErrs()
		return nil, &LoadError{Errs: l.errs}
	}
	files := [][]byte{data}
	if l.p.RateLimitly.CredentialsFile != "" {
		files = append(files, l.credData)
	}
	l.p.sum, l.p.hasSum = fileDigest(files...), true
	return l.p, nil
}

// fileDigest hashes file contents as the Reloader compares them: each as
// "len:bytes", in order (policy file, then credentials file).
func fileDigest(files ...[]byte) [sha256.Size]byte {
	h := sha256.New()
	for _, b := range files {
		fmt.Fprintf(h, "%d:", len(b))
		h.Write(b)
	}
	var s [sha256.Size]byte
	copy(s[:], h.Sum(nil))
	return s
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
	var rlNode, defaultsNode, tiersNode, zonesNode, trackersNode, servicesNode, ridNode *yaml.Node
	for _, e := range pairs {
		switch e.key {
		case "request_id":
			ridNode = e.v
		case "ratelimitly":
			rlNode = e.v
		case "defaults":
			defaultsNode = e.v
		case "tiers":
			tiersNode = e.v
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
	if tiersNode != nil {
		l.tiers(tiersNode)
	}
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
	l.invalidWarnings()
	l.forwardingWarnings()
}

// forwardingWarnings warns about zones keyed on a forwarding header read
// as the client wrote it: any client sets X-Forwarded-For to whatever
// spreads its requests over fresh buckets. client_address reads it only
// from trusted balancers.
func (l *loader) forwardingWarnings() {
	for _, z := range l.p.Zones {
		if v := z.Bucket.ForwardingHeader(); v != "" {
			l.p.Warnings = append(l.p.Warnings, Error{File: l.file, Line: z.Line, Msg: fmt.Sprintf(
				"zones.%s.bucket renders %s, which any client can write: behind a balancer set client_address "+
					"(from, trusted) and key on {remote_addr} instead", z.Name, v)})
		}
	}
}

// invalidWarnings warns about zones and trackers rendered from a value the
// client controls while an invalid value follows a failure policy that
// admits: the client could switch the limit off by sending an empty or
// oversized value, or none.
func (l *loader) invalidWarnings() {
	p := l.p
	fail := p.RateLimitly.Fail
	if fail == FailClose {
		return
	}
	warn := func(line int, what, v string) {
		p.Warnings = append(p.Warnings, Error{File: l.file, Line: line, Msg: fmt.Sprintf(
			"%s renders %s, which the client controls: under fail: %s a missing, empty or oversized value "+
				"admits the request without this limit; set invalid: deny (here or in ratelimitly)", what, v, fail)})
	}
	for _, z := range p.Zones {
		if v := z.Bucket.ClientValue(); v != "" && p.invalidPolicy(z.Invalid) != InvalidDeny {
			warn(z.Line, "zones."+z.Name+".bucket", v)
		}
	}
	for _, t := range p.Trackers {
		if v := t.Service.ClientValue(); v != "" && p.invalidPolicy(t.Invalid) != InvalidDeny {
			warn(t.Line, "trackers."+t.Name+".service", v)
		}
	}
}
