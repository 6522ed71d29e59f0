package admission

import (
	"errors"
	"fmt"
	"io"
	"math"
	"net/netip"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/rl-tproxy/rl-tproxy/internal/fileerr"

	"gopkg.in/yaml.v3"
)

// Error is one problem in a policy (or its credentials) file.
type Error = fileerr.Error

// LoadError lists every problem found while loading a policy, each as
// FILE:LINE: message, in file and line order.
type LoadError = fileerr.List

// kv is one key/value pair of a YAML mapping.
type kv struct {
	key  string
	k, v *yaml.Node
}

// nodes is the YAML-walking half of the loader: typed accessors that record
// a located error and report failure instead of stopping.
type nodes struct {
	file string
	errs []Error
}

func (l *nodes) errorf(n *yaml.Node, format string, args ...any) {
	line := 1
	if n != nil && n.Line > 0 {
		line = n.Line
	}
	l.errs = append(l.errs, Error{File: l.file, Line: line, Msg: fmt.Sprintf(format, args...)})
}

func (l *nodes) sortErrs() {
	sort.SliceStable(l.errs, func(i, j int) bool {
		a, b := l.errs[i], l.errs[j]
		if (a.File == l.file) != (b.File == l.file) {
			return a.File == l.file
		}
		return a.Line < b.Line
	})
}

// yamlSyntax turns a yaml.v3 decode error into a line and message.
func yamlSyntax(err error) (int, string) {
	if errors.Is(err, io.EOF) {
		return 1, "empty policy file"
	}
	s := err.Error()
	if rest, ok := strings.CutPrefix(s, "yaml: line "); ok {
		if i := strings.IndexByte(rest, ':'); i > 0 {
			if n, e := strconv.Atoi(rest[:i]); e == nil {
				return n, "invalid YAML:" + rest[i+1:]
			}
		}
	}
	return 1, "invalid YAML: " + strings.TrimPrefix(s, "yaml: ")
}

func kindName(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.AliasNode:
		return "an alias"
	case yaml.ScalarNode:
		switch n.Tag {
		case "!!null":
			return "null"
		case "!!str":
			return fmt.Sprintf("string %q", short(n.Value))
		case "!!int":
			return "integer " + short(n.Value)
		case "!!bool":
			return "boolean " + n.Value
		case "!!float":
			return "number " + short(n.Value)
		}
		return fmt.Sprintf("%s %q", n.Tag, short(n.Value))
	}
	return "an unsupported node"
}

func short(s string) string {
	if len(s) > 40 {
		return s[:40] + "..."
	}
	return s
}

// alias rejects YAML aliases: they would let a small file expand without
// bound and hide where a value came from.
func (l *nodes) alias(n *yaml.Node, ctx string) bool {
	if n.Kind == yaml.AliasNode {
		l.errorf(n, "%s: YAML aliases are not supported", ctx)
		return true
	}
	return false
}

// mapping returns the pairs of a mapping node after reporting unknown and
// duplicate keys; ok is false when n is not a mapping.
func (l *nodes) mapping(n *yaml.Node, ctx string, allowed ...string) ([]kv, bool) {
	if l.alias(n, ctx) {
		return nil, false
	}
	if n.Kind != yaml.MappingNode {
		l.errorf(n, "%s: want a mapping, got %s", ctx, kindName(n))
		return nil, false
	}
	var out []kv
	seen := map[string]bool{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		if k.Kind != yaml.ScalarNode || k.Tag == "!!null" {
			l.errorf(k, "%s: keys must be plain strings", ctx)
			continue
		}
		known := false
		for _, a := range allowed {
			if a == k.Value {
				known = true
				break
			}
		}
		if !known {
			l.errorf(k, "%s: unknown key %q (allowed: %s)", ctx, short(k.Value), strings.Join(allowed, ", "))
			continue
		}
		if seen[k.Value] {
			l.errorf(k, "%s: duplicate key %q", ctx, k.Value)
			continue
		}
		seen[k.Value] = true
		out = append(out, kv{key: k.Value, k: k, v: v})
	}
	return out, true
}

func (l *nodes) scalar(v *yaml.Node, ctx, want string, tags ...string) bool {
	if l.alias(v, ctx) {
		return false
	}
	if v.Kind == yaml.ScalarNode {
		for _, t := range tags {
			if v.Tag == t {
				return true
			}
		}
	}
	l.errorf(v, "%s: want %s, got %s", ctx, want, kindName(v))
	return false
}

func (l *nodes) str(v *yaml.Node, ctx string) (string, bool) {
	if !l.scalar(v, ctx, "a string", "!!str") {
		return "", false
	}
	return v.Value, true
}

func (l *nodes) boolean(v *yaml.Node, ctx string) (*bool, bool) {
	if !l.scalar(v, ctx, "true or false", "!!bool") {
		return nil, false
	}
	b, err := strconv.ParseBool(strings.ToLower(v.Value))
	if err != nil {
		l.errorf(v, "%s: want true or false, got %q", ctx, short(v.Value))
		return nil, false
	}
	return &b, true
}

func (l *nodes) integer(v *yaml.Node, ctx string, lo, hi int64) (int64, bool) {
	if !l.scalar(v, ctx, "an integer", "!!int") {
		return 0, false
	}
	n, err := strconv.ParseInt(strings.ReplaceAll(v.Value, "_", ""), 0, 64)
	if err != nil || n < lo || n > hi {
		l.errorf(v, "%s: want an integer from %d to %d, got %s", ctx, lo, hi, short(v.Value))
		return 0, false
	}
	return n, true
}

// duration parses a Go duration string ("20ms", "1m30s") within [lo, hi].
func (l *nodes) duration(v *yaml.Node, ctx string, lo, hi time.Duration) (time.Duration, bool) {
	if !l.scalar(v, ctx, "a duration such as 250ms", "!!str", "!!int") {
		return 0, false
	}
	if v.Tag == "!!int" && v.Value != "0" {
		l.errorf(v, "%s: bad duration %s: add a unit, such as %sms or %ss", ctx, short(v.Value), short(v.Value), short(v.Value))
		return 0, false
	}
	d, err := time.ParseDuration(v.Value)
	if err != nil {
		l.errorf(v, "%s: bad duration %q: want a number with a unit (ms, s, m, h), such as 250ms", ctx, short(v.Value))
		return 0, false
	}
	if d < lo || d > hi {
		l.errorf(v, "%s: duration %s out of range %s..%s", ctx, d, lo, hi)
		return 0, false
	}
	return d, true
}

// size parses a byte count: an integer, or a string with a KiB, MiB or GiB
// suffix.
func (l *nodes) size(v *yaml.Node, ctx string, hi int64) (int64, bool) {
	if !l.scalar(v, ctx, "a byte count such as 16384 or 16KiB", "!!int", "!!str") {
		return 0, false
	}
	s, mul := v.Value, int64(1)
	if v.Tag == "!!str" {
		for _, u := range []struct {
			suf string
			mul int64
		}{{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}} {
			if n, ok := strings.CutSuffix(s, u.suf); ok {
				s, mul = n, u.mul
				break
			}
		}
		if mul == 1 {
			l.errorf(v, "%s: bad size %q: want an integer or a KiB, MiB or GiB suffix", ctx, short(v.Value))
			return 0, false
		}
	}
	n, err := strconv.ParseInt(strings.ReplaceAll(s, "_", ""), 10, 64)
	if err != nil || n < 0 || n > hi/mul {
		l.errorf(v, "%s: bad size %q: want 0..%d bytes", ctx, short(v.Value), hi)
		return 0, false
	}
	return n * mul, true
}

// rate parses "N/s", "N/m" or "N/h" into tokens per period.
func (l *nodes) rate(v *yaml.Node, ctx string) (rate, periodMs uint32, ok bool) {
	if !l.scalar(v, ctx, "a rate such as 100/s", "!!str") {
		return 0, 0, false
	}
	bad := func() (uint32, uint32, bool) {
		l.errorf(v, "%s: bad rate %q: want N/s, N/m or N/h with N from 1 to %d", ctx, short(v.Value), uint32(math.MaxUint32))
		return 0, 0, false
	}
	num, unit, found := strings.Cut(v.Value, "/")
	if !found {
		return bad()
	}
	switch unit {
	case "s":
		periodMs = 1000
	case "m":
		periodMs = 60_000
	case "h":
		periodMs = 3_600_000
	default:
		return bad()
	}
	for i := 0; i < len(num); i++ {
		if num[i] < '0' || num[i] > '9' {
			return bad()
		}
	}
	n, err := strconv.ParseUint(num, 10, 32)
	if err != nil || n == 0 {
		return bad()
	}
	return uint32(n), periodMs, true
}

// strList accepts a string or a list of strings.
func (l *nodes) strList(v *yaml.Node, ctx string) ([]string, []*yaml.Node, bool) {
	if l.alias(v, ctx) {
		return nil, nil, false
	}
	if v.Kind == yaml.ScalarNode {
		s, ok := l.str(v, ctx)
		if !ok {
			return nil, nil, false
		}
		return []string{s}, []*yaml.Node{v}, true
	}
	if v.Kind != yaml.SequenceNode {
		l.errorf(v, "%s: want a string or a list of strings, got %s", ctx, kindName(v))
		return nil, nil, false
	}
	out := make([]string, 0, len(v.Content))
	ns := make([]*yaml.Node, 0, len(v.Content))
	ok := true
	for i, it := range v.Content {
		s, good := l.str(it, fmt.Sprintf("%s[%d]", ctx, i))
		if !good {
			ok = false
			continue
		}
		out = append(out, s)
		ns = append(ns, it)
	}
	return out, ns, ok
}

func (l *nodes) list(v *yaml.Node, ctx string) ([]*yaml.Node, bool) {
	if l.alias(v, ctx) {
		return nil, false
	}
	if v.Kind != yaml.SequenceNode {
		l.errorf(v, "%s: want a list, got %s", ctx, kindName(v))
		return nil, false
	}
	return v.Content, true
}

// isName accepts zone, tracker, service and location names.
func isName(s string) bool {
	if s == "" || len(s) > 64 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c == '_' || c == '-' || c == '.' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9') {
			return false
		}
	}
	return true
}

func (l *nodes) name(v *yaml.Node, ctx string) (string, bool) {
	s, ok := l.str(v, ctx)
	if !ok {
		return "", false
	}
	if !isName(s) {
		l.errorf(v, "%s: bad name %q: use 1-64 letters, digits, '_', '-' or '.'", ctx, short(s))
		return "", false
	}
	return s, true
}

// hostPort validates "host:port" (host an IP or a DNS name, port 1..65535).
func (l *nodes) hostPort(v *yaml.Node, ctx string) (string, bool) {
	s, ok := l.str(v, ctx)
	if !ok {
		return "", false
	}
	host, port, err := splitHostPort(s)
	if err != nil {
		l.errorf(v, "%s: bad address %q: %v", ctx, short(s), err)
		return "", false
	}
	if _, err := netip.ParseAddr(host); err != nil && !isDNSName(host) {
		l.errorf(v, "%s: bad address %q: host is neither an IP address nor a DNS name", ctx, short(s))
		return "", false
	}
	_ = port
	return s, true
}

func splitHostPort(s string) (string, uint16, error) {
	i := strings.LastIndexByte(s, ':')
	if i < 0 {
		return "", 0, errors.New("want host:port")
	}
	host, ps := s[:i], s[i+1:]
	if strings.HasPrefix(host, "[") && strings.HasSuffix(host, "]") {
		host = host[1 : len(host)-1]
	} else if strings.Contains(host, ":") {
		return "", 0, errors.New("write IPv6 addresses as [addr]:port")
	}
	if host == "" {
		return "", 0, errors.New("missing host")
	}
	p, err := strconv.ParseUint(ps, 10, 16)
	if err != nil || p == 0 {
		return "", 0, errors.New("port must be 1..65535")
	}
	return host, uint16(p), nil
}

func isDNSName(s string) bool {
	s = strings.TrimSuffix(s, ".")
	if s == "" || len(s) > 253 {
		return false
	}
	for _, label := range strings.Split(s, ".") {
		if label == "" || len(label) > 63 || label[0] == '-' || label[len(label)-1] == '-' {
			return false
		}
		for i := 0; i < len(label); i++ {
			c := label[i]
			if !(c == '-' || c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9') {
				return false
			}
		}
	}
	return true
}
