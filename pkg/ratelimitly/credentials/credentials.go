// Package credentials loads RateLimitly credentials (tenant, key id, 32-byte
// secret, optional max horizon) from a strict YAML file without ever
// exposing the secret in errors, logs or formatted output.
package credentials

import (
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/rl-tproxy/rl-tproxy/internal/fileerr"
	"github.com/rl-tproxy/rl-tproxy/internal/safefile"

	"gopkg.in/yaml.v3"
)

// SecretSize is the length of a decoded secret: an XChaCha20-Poly1305 key.
const SecretSize = 32

// Credential is one RateLimitly key. The zero MaxHorizon means no limit
// beyond what the wire's 16-bit ttl_ms field can carry.
type Credential struct {
	Tenant     string
	KeyID      uint32
	Secret     [SecretSize]byte // never printed: String, GoString, Format, MarshalJSON and LogValue redact it
	MaxHorizon time.Duration
}

const redacted = "REDACTED"

// String describes the credential without its secret.
func (c Credential) String() string {
	return fmt.Sprintf("credential{tenant=%q key_id=%d secret=%s max_horizon=%s}", c.Tenant, c.KeyID, redacted, c.MaxHorizon)
}

// GoString is String: %#v must not dump the secret bytes either.
func (c Credential) GoString() string { return c.String() }

// Format makes every fmt verb (%v, %+v, %#v, %s, %x, %q, ...) print the
// redacted description, so no verb can reach the secret.
func (c Credential) Format(f fmt.State, verb rune) {
	_, _ = f.Write([]byte(c.String()))
}

// LogValue keeps the secret out of slog records (text and JSON handlers).
func (c Credential) LogValue() slog.Value {
	return slog.GroupValue(
		slog.String("tenant", c.Tenant),
		slog.Uint64("key_id", uint64(c.KeyID)),
		slog.String("secret", redacted),
		slog.Duration("max_horizon", c.MaxHorizon),
	)
}

// MarshalJSON keeps the secret out of JSON encodings.
func (c Credential) MarshalJSON() ([]byte, error) {
	return fmt.Appendf(nil, `{"tenant":%s,"key_id":%d,"secret":%q,"max_horizon":%q}`,
		strconv.Quote(c.Tenant), c.KeyID, redacted, c.MaxHorizon.String()), nil
}

// Error is one problem in a credentials file, located by line. Its message
// never contains a value from the file, so a secret cannot leak through it.
type Error = fileerr.Error

// LoadError lists every problem found in a credentials file.
type LoadError = fileerr.List

// maxFileSize bounds a credentials file.
const maxFileSize = 1 << 20

// Load reads and parses the credentials file at path. The file must be a
// regular file that only its owner (root or this process's user) and
// group can change (safefile.ReadSecret); a world-readable one is loaded.
func Load(path string) ([]Credential, error) {
	data, _, err := safefile.ReadSecret(path, maxFileSize)
	if err != nil {
		return nil, fmt.Errorf("load credentials %s: %w", path, err)
	}
	return Parse(path, data)
}

// Parse parses a credentials file's contents; name is used in errors.
// Accepted shapes: one credential at top level, or `credentials:` with a
// non-empty list of them. Every error is reported (as a *LoadError), not
// just the first.
func Parse(name string, data []byte) ([]Credential, error) {
	p := parser{file: name}
	var doc yaml.Node
	dec := yaml.NewDecoder(strings.NewReader(string(data)))
	if err := dec.Decode(&doc); err != nil {
		// yaml.v3 syntax errors carry a line but no scalar contents.
		line, msg := yamlError(err)
		p.errorf(line, "%s", msg)
		return nil, p.result()
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); err == nil {
		p.errorf(extra.Line, "more than one YAML document")
	}
	root := &doc
	if root.Kind == yaml.DocumentNode && len(root.Content) == 1 {
		root = root.Content[0]
	}
	if root.Kind != yaml.MappingNode {
		p.errorf(root.Line, "want a mapping with tenant, key_id, secret or a credentials list")
		return nil, p.result()
	}
	var creds []Credential
	var list *yaml.Node
	single := false
	for i := 0; i+1 < len(root.Content); i += 2 {
		switch root.Content[i].Value {
		case "credentials":
			list = root.Content[i+1]
		case "tenant", "key_id", "secret", "max_horizon":
			single = true
		}
	}
	switch {
	case list != nil && single:
		p.errorf(root.Line, "use either one top-level credential or a credentials list, not both")
	case list != nil:
		p.checkKeys(root, map[string]bool{"credentials": true})
		if list.Kind != yaml.SequenceNode {
			p.errorf(list.Line, "credentials: want a list")
			break
		}
		if len(list.Content) == 0 {
			p.errorf(list.Line, "credentials: empty list")
		}
		seen := map[uint32]int{}
		for _, n := range list.Content {
			c, ok := p.credential(n)
			if !ok {
				continue
			}
			if prev, dup := seen[c.KeyID]; dup {
				p.errorf(n.Line, "duplicate key_id %d (first at line %d)", c.KeyID, prev)
				continue
			}
			seen[c.KeyID] = n.Line
			creds = append(creds, c)
		}
	default:
		if c, ok := p.credential(root); ok {
			creds = append(creds, c)
		}
	}
	if err := p.result(); err != nil {
		return nil, err
	}
	return creds, nil
}

type parser struct {
	file string
	errs []Error
}

func (p *parser) errorf(line int, format string, args ...any) {
	p.errs = append(p.errs, Error{File: p.file, Line: line, Msg: fmt.Sprintf(format, args...)})
}

func (p *parser) result() error {
	if len(p.errs) == 0 {
		return nil
	}
	return &LoadError{Errs: p.errs}
}

// checkKeys reports unknown and duplicate keys. Only key names are quoted,
// never values.
func (p *parser) checkKeys(m *yaml.Node, allowed map[string]bool) {
	seen := map[string]bool{}
	for i := 0; i+1 < len(m.Content); i += 2 {
		k := m.Content[i]
		if k.Kind != yaml.ScalarNode {
			p.errorf(k.Line, "keys must be plain strings")
			continue
		}
		if !allowed[k.Value] {
			p.errorf(k.Line, "unknown key %s (allowed: %s)", showKey(k.Value), allowedList(allowed))
			continue
		}
		if seen[k.Value] {
			p.errorf(k.Line, "duplicate key %q", k.Value)
		}
		seen[k.Value] = true
	}
}

var credentialKeys = map[string]bool{"tenant": true, "key_id": true, "secret": true, "max_horizon": true}

// credential parses one credential mapping. Error messages never echo a
// value: a secret pasted under the wrong key must not leak either.
func (p *parser) credential(m *yaml.Node) (Credential, bool) {
	var c Credential
	if m.Kind != yaml.MappingNode {
		p.errorf(m.Line, "credential: want a mapping with tenant, key_id, secret")
		return c, false
	}
	before := len(p.errs)
	p.checkKeys(m, credentialKeys)
	var have struct{ tenant, keyID, secret bool }
	for i := 0; i+1 < len(m.Content); i += 2 {
		k, v := m.Content[i].Value, m.Content[i+1]
		scalar := v.Kind == yaml.ScalarNode && v.Tag != "!!null"
		switch k {
		case "tenant":
			have.tenant = true
			if !scalar || v.Tag != "!!str" || v.Value == "" {
				p.errorf(v.Line, "tenant: want a non-empty string")
				continue
			}
			c.Tenant = v.Value
		case "key_id":
			have.keyID = true
			if !scalar || v.Tag != "!!int" {
				p.errorf(v.Line, "key_id: want an integer 0..4294967295")
				continue
			}
			n, err := strconv.ParseUint(strings.ReplaceAll(v.Value, "_", ""), 0, 32)
			if err != nil {
				p.errorf(v.Line, "key_id: want an integer 0..4294967295")
				continue
			}
			c.KeyID = uint32(n)
		case "secret":
			have.secret = true
			if !scalar || v.Tag != "!!str" {
				p.errorf(v.Line, "secret: want a base64 string of %d bytes", SecretSize)
				continue
			}
			if err := decodeSecret(&c.Secret, v.Value); err != nil {
				p.errorf(v.Line, "secret: %v", err)
			}
		case "max_horizon":
			if !scalar {
				p.errorf(v.Line, "max_horizon: want a duration such as 60ms")
				continue
			}
			d, err := time.ParseDuration(v.Value)
			if err != nil || d < 0 {
				p.errorf(v.Line, "max_horizon: want a non-negative duration such as 60ms")
				continue
			}
			if d%time.Millisecond != 0 {
				// The wire's ttl_ms is whole milliseconds; a server
				// comparing with a truncated 500us would see no limit.
				p.errorf(v.Line, "max_horizon: want whole milliseconds such as 60ms")
				continue
			}
			c.MaxHorizon = d
		}
	}
	if !have.tenant {
		p.errorf(m.Line, "missing tenant")
	}
	if !have.keyID {
		p.errorf(m.Line, "missing key_id")
	}
	if !have.secret {
		p.errorf(m.Line, "missing secret")
	}
	return c, len(p.errs) == before
}

var errSecretLength = fmt.Errorf("decodes to the wrong length: want exactly %d bytes", SecretSize)

// decodeSecret accepts standard base64 with or without padding. Its errors
// describe the problem without quoting any input.
func decodeSecret(dst *[SecretSize]byte, s string) error {
	s = strings.TrimSpace(s)
	var buf [64]byte
	enc := base64.StdEncoding
	if len(s)%4 != 0 {
		enc = base64.RawStdEncoding
	}
	if enc.DecodedLen(len(s)) > len(buf) {
		return errSecretLength
	}
	n, err := enc.Decode(buf[:], []byte(s))
	if err != nil {
		var ce base64.CorruptInputError
		if errors.As(err, &ce) {
			return fmt.Errorf("not valid base64 (bad byte at offset %d)", int64(ce))
		}
		return errors.New("not valid base64")
	}
	defer clear(buf[:])
	if n != SecretSize {
		return errSecretLength
	}
	copy(dst[:], buf[:n])
	return nil
}

// yamlError turns a yaml.v3 syntax error into a line and a message. The
// scanner's messages are fixed strings that never quote document content.
func yamlError(err error) (int, string) {
	if errors.Is(err, io.EOF) {
		return 1, "empty file: want a credential or a credentials list"
	}
	s := err.Error()
	if rest, ok := strings.CutPrefix(s, "yaml: line "); ok {
		if i := strings.IndexByte(rest, ':'); i > 0 {
			if n, e := strconv.Atoi(rest[:i]); e == nil {
				return n, "invalid YAML:" + rest[i+1:]
			}
		}
	}
	return 1, "invalid YAML"
}

// showKey quotes a key name only when it looks like an identifier, so a
// secret pasted as a key is not echoed back.
func showKey(k string) string {
	if len(k) == 0 || len(k) > 24 {
		return "(name not shown)"
	}
	for i := 0; i < len(k); i++ {
		c := k[i]
		if !(c == '_' || c == '-' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9') {
			return "(name not shown)"
		}
	}
	return strconv.Quote(k)
}

func allowedList(allowed map[string]bool) string {
	names := make([]string, 0, len(allowed))
	for k := range allowed {
		names = append(names, k)
	}
	sort.Strings(names)
	return strings.Join(names, ", ")
}
