package admission

import (
	"bytes"
	"net/netip"
)

// HeaderGetter looks up a request header by name, case-insensitively,
// without allocating. It returns the first value.
type HeaderGetter interface {
	HeaderValue(name string) ([]byte, bool)
}

// Request is what matching and templates see of an HTTP request. The byte
// slices alias the proxy's buffers and are only read.
type Request struct {
	Remote, Local netip.AddrPort // client, and original destination
	Method        []byte
	Host          []byte // Host header (or absolute-form authority), port allowed
	Path          []byte // request target up to '?', raw (not decoded)
	Query         []byte // after '?', raw
	Headers       HeaderGetter
}

// Match is a location's request predicate. Every set condition must hold;
// an empty Match matches everything.
type Match struct {
	Hosts      []string // lower-case; "*.example.com" matches subdomains
	Path       string   // exact path
	PathPrefix string
	Methods    []string          // upper-case tokens; any when empty
	Headers    []HeaderCondition // all must hold
}

// HeaderCondition tests one request header.
type HeaderCondition struct {
	Name    string // lower-case
	Present bool   // true: header must be present; false: must be absent (when Value is unset)
	Value   string // exact value when HasValue
	// HasValue selects an exact-value test instead of a presence test.
	HasValue bool
}

// Match returns the first location of s that matches r, or nil when none
// does (the request is then unprotected). It does not allocate.
func (s *Service) Match(r *Request) *Location {
	for _, l := range s.Locations {
		if l.Match.matches(r) {
			return l
		}
	}
	return nil
}

func (m *Match) matches(r *Request) bool {
	if m.Path != "" && string(r.Path) != m.Path {
		return false
	}
	if m.PathPrefix != "" && !bytes.HasPrefix(r.Path, []byte(m.PathPrefix)) {
		return false
	}
	if len(m.Methods) > 0 {
		ok := false
		for _, meth := range m.Methods {
			if string(r.Method) == meth {
				ok = true
				break
			}
		}
		if !ok {
			return false
		}
	}
	if len(m.Hosts) > 0 && !matchHost(m.Hosts, hostOnly(r.Host)) {
		return false
	}
	for i := range m.Headers {
		hc := &m.Headers[i]
		var v []byte
		found := false
		if r.Headers != nil {
			v, found = r.Headers.HeaderValue(hc.Name)
		}
		switch {
		case hc.HasValue:
			if !found || string(v) != hc.Value {
				return false
			}
		case found != hc.Present:
			return false
		}
	}
	return true
}

// matchHost compares case-insensitively; a pattern "*.example.com" matches
// any name ending in ".example.com" (not example.com itself).
func matchHost(patterns []string, host []byte) bool {
	if len(host) > 0 && host[len(host)-1] == '.' {
		host = host[:len(host)-1]
	}
	for _, p := range patterns {
		if len(p) > 1 && p[0] == '*' {
			suf := p[1:] // ".example.com"
			if len(host) > len(suf) && equalFold(host[len(host)-len(suf):], suf) {
				return true
			}
			continue
		}
		if equalFold(host, p) {
			return true
		}
	}
	return false
}

// equalFold compares ASCII case-insensitively; p is already lower-case.
func equalFold(b []byte, p string) bool {
	if len(b) != len(p) {
		return false
	}
	for i := 0; i < len(b); i++ {
		c := b[i]
		if 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		if c != p[i] {
			return false
		}
	}
	return true
}
