package admission

import (
	"crypto/rand"
	"errors"
	"fmt"
	"io/fs"
	"net/netip"
	"path/filepath"
	"time"

	"github.com/rl-tproxy/rl-tproxy/pkg/ratelimitly"
	"github.com/rl-tproxy/rl-tproxy/pkg/ratelimitly/credentials"
	"gopkg.in/yaml.v3"
)

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
		case "invalid":
			rl.Invalid = l.invalid(e.v, ctx)
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

// invalid reads an `invalid:` value (fail or deny).
func (l *loader) invalid(v *yaml.Node, ctx string) InvalidPolicy {
	s, ok := l.str(v, ctx)
	if !ok {
		return InvalidInherit
	}
	switch s {
	case "fail":
		return InvalidFail
	case "deny":
		return InvalidDeny
	}
	l.errorf(v, "%s: want fail or deny, got %q", ctx, short(s))
	return InvalidInherit
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
	data, err := l.readCredentials(rl.CredentialsFile, credNode.Line)
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
