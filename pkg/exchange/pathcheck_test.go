package exchange

import (
	"bytes"
	"strings"
	"testing"

	"github.com/rl-tproxy/rl-tproxy/pkg/admission"
)

func TestCheckPath(t *testing.T) {
	reject, decode := &Service{}, &Service{DecodeEscapedSlashes: true}
	for _, tc := range []struct {
		path     string
		rej, dec string // rule under reject and under decode; "" = proceeds
	}{
		{"/", "", ""},
		{"/api/x", "", ""},
		{"/api/%61x", "", ""},
		{"/a/../b", "", ""}, // dots without an escaped slash
		{"/api%2fx", RuleEscapedSlash, ""},
		{"/api%2Fx", RuleEscapedSlash, ""},
		{"/api%5cx", RuleEscapedSlash, ""},
		{"/api%5Cx", RuleEscapedSlash, ""},
		{"/api%252fx", "", ""}, // an escaped '%' then "2f"
		{"/x%2", "", ""},       // too short to be an escape
		{"/a%2F..", RuleEscapedSlash, RuleEscapedSlashDotSegment},
		{"/a%2F.%2Fb", RuleEscapedSlash, RuleEscapedSlashDotSegment},
		{"/a%2F%2e%2E/b", RuleEscapedSlash, RuleEscapedSlashDotSegment},
		{"/public/a%2Fb/../../api/x", RuleEscapedSlash, RuleEscapedSlashDotSegment},
		{"/a%5C..%5Cb", RuleEscapedSlash, RuleEscapedSlashDotSegment},
		{"/a%2Fb\\..", RuleEscapedSlash, RuleEscapedSlashDotSegment},
		{"/a%2F...", RuleEscapedSlash, ""}, // "..." is a name, not a dot segment
		{"/a%2F.b", RuleEscapedSlash, ""},
	} {
		for _, m := range []struct {
			svc  *Service
			want string
		}{{reject, tc.rej}, {decode, tc.dec}} {
			status, rule := CheckPath(m.svc, []byte(tc.path))
			if rule != m.want || (status != 0) != (m.want != "") || status != 0 && status != 400 {
				t.Errorf("%q decode=%v: %d %q, want %q", tc.path, m.svc.DecodeEscapedSlashes, status, rule, m.want)
			}
		}
	}
	if s, r := CheckPath(nil, []byte("/a%2Fb")); s != 400 || r != RuleEscapedSlash {
		t.Errorf("no service: %d %q, want the default (reject)", s, r)
	}
}

// FuzzCheckPath: the default refuses every path holding %2F or %5C and
// nothing else; a path a decoding service lets through matches at the
// place an upstream that keeps the escapes as data serves it (the
// decoded normalization equals the normalization with %2F kept as data,
// then decoded), so resolving dots never moves the match.
func FuzzCheckPath(f *testing.F) {
	for _, s := range []string{"/api%2fx", "/a/b%2F..%2f..%2Fc", "/public/a%2Fb/../../api/x", "/a%5C..%5cb", "/%2", "/a/./b"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, p []byte) {
		up := strings.ToUpper(string(p))
		has := strings.Contains(up, "%2F") || strings.Contains(up, "%5C")
		status, _ := CheckPath(&Service{}, p)
		if (status != 0) != has {
			t.Fatalf("%q: reject mode status %d, escaped slash %v", p, status, has)
		}
		if status, _ := CheckPath(&Service{DecodeEscapedSlashes: true}, p); status != 0 || bytes.IndexByte(p, 0) >= 0 {
			return
		}
		got, ok := admission.NormalizePath(nil, p)
		// The same path with %2F as data: a byte NormalizePath keeps.
		data := bytes.ReplaceAll(bytes.ReplaceAll(p, []byte("%2F"), []byte{0}), []byte("%2f"), []byte{0})
		kept, ok2 := admission.NormalizePath(nil, data)
		if ok != ok2 {
			t.Fatalf("%q: normalizes %v, with %%2F as data %v", p, ok, ok2)
		}
		if !ok {
			return
		}
		want := bytes.ReplaceAll(kept, []byte{0}, []byte("/"))
		for bytes.Contains(want, []byte("//")) {
			want = bytes.ReplaceAll(want, []byte("//"), []byte("/"))
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("%q: matched as %q, served as %q", p, got, want)
		}
	})
}
