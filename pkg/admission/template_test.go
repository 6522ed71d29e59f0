package admission

import (
	"errors"
	"net/netip"
	"strings"
	"testing"
)

// ptHeaders is a HeaderGetter over name/value pairs (case-insensitive,
// allocation-free), like the proxy's parsed head.
type ptHeaders [][2]string

func (h ptHeaders) HeaderValue(name string) ([]byte, bool) {
	for _, kv := range h {
		if strings.EqualFold(kv[0], name) {
			return []byte(kv[1]), true
		}
	}
	return nil, false
}

// ptHeaderBytes avoids the []byte conversion allocation of ptHeaders for
// the zero-allocation tests.
type ptHeaderBytes []struct{ name, value []byte }

func (h ptHeaderBytes) HeaderValue(name string) ([]byte, bool) {
	for _, kv := range h {
		if len(kv.name) == len(name) && strings.EqualFold(string(kv.name), name) {
			return kv.value, true
		}
	}
	return nil, false
}

func ptRequest() *Request {
	return &Request{
		Remote:  netip.MustParseAddrPort("[::ffff:192.0.2.7]:40000"),
		Local:   netip.MustParseAddrPort("10.0.0.1:8080"),
		Method:  []byte("POST"),
		Host:    []byte("API.Example.com:8080"),
		Path:    []byte("/api/v1/items"),
		Query:   []byte("a=1&user=bob&empty=&flag"),
		Headers: ptHeaderBytes{{[]byte("X-Api-Key"), []byte("k123")}, {[]byte("Cookie"), []byte(`sid=abc; theme="dark" ; x=1`)}},
	}
}

func TestTemplateRender(t *testing.T) {
	r := ptRequest()
	cases := map[string]string{
		"":                                       "",
		"static":                                 "static",
		"{remote_addr}":                          "192.0.2.7",
		"{remote_port}":                          "40000",
		"{server_addr}":                          "10.0.0.1",
		"{server_port}":                          "8080",
		"{host}":                                 "api.example.com",
		"{method} {path}":                        "POST /api/v1/items",
		"q:{query.user}":                         "q:bob",
		"q:{query.empty}|":                       "q:|",
		"q:{query.flag}|":                        "q:|",
		"q:{query.none}|":                        "q:|",
		"{header.x-api-key}":                     "k123",
		"{header.X-API-KEY}":                     "k123",
		"{header.missing}":                       "",
		"{cookie.sid}":                           "abc",
		"{cookie.theme}":                         "dark",
		"{cookie.x}":                             "1",
		"{cookie.nope}":                          "",
		"{{literal}} {method}":                   "{literal} POST",
		"a}}b{{c":                                "a}b{c",
		"c:{remote_addr}:{host}{path}?{query.a}": "c:192.0.2.7:api.example.com/api/v1/items?1",
	}
	for src, want := range cases {
		tm, err := CompileTemplate(src)
		if err != nil {
			t.Errorf("compile %q: %v", src, err)
			continue
		}
		got, err := tm.Render([]byte("prefix|"), r)
		if err != nil || string(got) != "prefix|"+want {
			t.Errorf("render %q = %q, %v; want %q", src, got, err, "prefix|"+want)
		}
	}
}

func TestTemplateHostForms(t *testing.T) {
	tm, _ := CompileTemplate("{host}")
	for host, want := range map[string]string{
		"example.com":      "example.com",
		"EXAMPLE.com:80":   "example.com",
		"[::1]:8080":       "[::1]",
		"[::1]":            "[::1]",
		"10.0.0.1:443":     "10.0.0.1",
		"":                 "",
		"weird:port:x":     "weird:port:x",
		"host.example:abc": "host.example:abc",
	} {
		got, _ := tm.Render(nil, &Request{Host: []byte(host)})
		if string(got) != want {
			t.Errorf("host %q rendered %q, want %q", host, got, want)
		}
	}
	// A request without addresses or headers renders empty values.
	tm, _ = CompileTemplate("{remote_addr}{remote_port}{server_addr}{server_port}{header.a}{cookie.b}")
	if got, err := tm.Render(nil, &Request{}); err != nil || len(got) != 0 {
		t.Errorf("empty request rendered %q %v", got, err)
	}
}

func TestTemplateCompileErrors(t *testing.T) {
	for src, want := range map[string]string{
		"{remote_ip}":   "offset 0: unknown variable {remote_ip}",
		"a{}":           "offset 1: empty variable {}",
		"a{host":        "unterminated '{' at offset 1",
		"a}b":           "unmatched '}' at offset 1",
		"{query.}":      "needs a name",
		"{header.a b}":  `invalid name "a b"`,
		"{cookie.a;b}":  `invalid name "a;b"`,
		"{query.a&b}":   `invalid name "a&b"`,
		"x{host}{Host}": "offset 7: unknown variable {Host}",
	} {
		_, err := CompileTemplate(src)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("compile %q: %v, want %q", src, err, want)
		}
	}
}

func TestTemplateLimits(t *testing.T) {
	tm, _ := CompileTemplate("b:{header.x}")
	tm.max, tm.nonEmpty = 10, true
	dst := []byte("keep")
	got, err := tm.Render(dst, &Request{Headers: ptHeaders{{"x", "12345678"}}})
	if err != nil || string(got) != "keepb:12345678" {
		t.Fatalf("fits: %q %v", got, err)
	}
	got, err = tm.Render(dst, &Request{Headers: ptHeaders{{"x", "123456789"}}})
	if !errors.Is(err, ErrTemplateTooLong) || string(got) != "keep" {
		t.Fatalf("too long: %q %v", got, err)
	}
	empty, _ := CompileTemplate("{header.x}")
	empty.nonEmpty = true
	if got, err := empty.Render(dst, &Request{}); !errors.Is(err, ErrTemplateEmpty) || string(got) != "keep" {
		t.Fatalf("empty: %q %v", got, err)
	}
	// The loader sets the limits: bucket 1024 non-empty, label 256.
	p := ptLoad(t, ptEmbedded+"zones:\n  z: {bucket: \"{header.k}\", rate: 1/s}\n"+ptService+"    limit: [z]\n    label: \"{header.l}\"\n")
	loc := p.Services[0].Locations[0]
	if loc.Limits[0].Bucket.Max() != MaxBucketLen || loc.Label.Max() != MaxLabelLen {
		t.Fatal("loader did not set template limits")
	}
	r := &Request{Headers: ptHeaders{{"k", strings.Repeat("k", 1025)}, {"l", ""}}}
	if _, err := loc.Limits[0].Bucket.Render(nil, r); !errors.Is(err, ErrTemplateTooLong) {
		t.Fatalf("1025-byte bucket: %v", err)
	}
	if _, err := loc.Limits[0].Bucket.Render(nil, &Request{}); !errors.Is(err, ErrTemplateEmpty) {
		t.Fatalf("empty bucket: %v", err)
	}
	if got, err := loc.Label.Render(nil, r); err != nil || len(got) != 0 {
		t.Fatalf("empty label is allowed: %q %v", got, err)
	}
}

func BenchmarkTemplateRender(b *testing.B) {
	r := ptRequest()
	tm, err := CompileTemplate("client:{remote_addr}:{host}:{header.x-api-key}:{cookie.sid}:{query.user}")
	if err != nil {
		b.Fatal(err)
	}
	buf := make([]byte, 0, 256)
	b.ReportAllocs()
	for b.Loop() {
		buf, _ = tm.Render(buf[:0], r)
	}
}

func BenchmarkTemplateRenderRemoteAddr(b *testing.B) {
	r := ptRequest()
	tm, _ := CompileTemplate("client:{remote_addr}")
	buf := make([]byte, 0, 64)
	b.ReportAllocs()
	for b.Loop() {
		buf, _ = tm.Render(buf[:0], r)
	}
}
