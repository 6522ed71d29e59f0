package admission

import (
	"fmt"
	"testing"
)

const ptMatchPolicy = ptEmbedded + `zones:
  z: {bucket: "{remote_addr}", rate: 10/s}
services:
  - name: web
    listen: 127.0.0.1:8080
    upstream: 127.0.0.1:8081
    locations:
      - {name: health, match: {path: /healthz}}
      - {name: admin, match: {host: [admin.example.com, "*.internal"], path_prefix: /admin/}, limit: [z]}
      - {name: post-api, match: {path_prefix: /api/, methods: [POST, PUT]}, limit: [z]}
      - name: keyed
        match: {path_prefix: /api/, headers: {X-Api-Key: true, X-Debug: false, X-Env: prod}}
        limit: [z]
      - {name: api, match: {path_prefix: /api/}, limit: [z]}
`

func TestMatch(t *testing.T) {
	p := ptLoad(t, ptMatchPolicy)
	s := p.Services[0]
	cases := []struct {
		method, host, path string
		headers            ptHeaders
		want               string
	}{
		{"GET", "x", "/healthz", nil, "health"},
		{"GET", "x", "/healthz/", nil, ""}, // exact path only
		{"GET", "x", "/healthzz", nil, ""},
		{"GET", "admin.example.com", "/admin/users", nil, "admin"},
		{"GET", "ADMIN.Example.COM:8443", "/admin/users", nil, "admin"},
		{"GET", "admin.example.com.", "/admin/", nil, "admin"},
		{"GET", "db.internal", "/admin/x", nil, "admin"},
		{"GET", "a.b.internal", "/admin/x", nil, "admin"},
		{"GET", "internal", "/admin/x", nil, ""}, // *.internal needs a subdomain
		{"GET", "evil-internal", "/admin/x", nil, ""},
		{"GET", "other.example.com", "/admin/x", nil, ""},
		{"POST", "x", "/api/items", nil, "post-api"},
		{"PUT", "x", "/api/items", nil, "post-api"},
		{"post", "x", "/api/items", nil, "api"}, // methods are case-sensitive
		{"GET", "x", "/api/items", ptHeaders{{"x-api-key", "k"}, {"X-ENV", "prod"}}, "keyed"},
		{"GET", "x", "/api/items", ptHeaders{{"x-api-key", "k"}, {"X-Env", "prod"}, {"x-debug", "1"}}, "api"}, // absent header present
		{"GET", "x", "/api/items", ptHeaders{{"x-api-key", "k"}, {"X-Env", "Prod"}}, "api"},                   // exact value
		{"GET", "x", "/api/items", ptHeaders{{"X-Env", "prod"}}, "api"},                                       // missing required header
		{"GET", "x", "/api/", nil, "api"},
		{"GET", "x", "/api", nil, ""}, // prefix /api/ is not /api
		{"GET", "x", "/", nil, ""},
	}
	for _, tc := range cases {
		r := &Request{Method: []byte(tc.method), Host: []byte(tc.host), Path: []byte(tc.path)}
		if tc.headers != nil {
			r.Headers = tc.headers
		}
		got := s.Match(r)
		name := ""
		if got != nil {
			name = got.Name
		}
		if name != tc.want {
			t.Errorf("%s %s%s %v: matched %q, want %q", tc.method, tc.host, tc.path, tc.headers, name, tc.want)
		}
	}
}

// A service written without locations has one implicit catch-all location;
// one with an empty list matches nothing.
func TestMatchImplicitAndEmpty(t *testing.T) {
	p := ptLoad(t, ptEmbedded+"zones:\n  z: {bucket: x, rate: 1/s}\nservices:\n  - {name: a, port: 80, upstream: 127.0.0.1:80, limit: [z]}\n  - {name: b, port: 81, upstream: 127.0.0.1:81, limit: [z], locations: []}\n")
	r := &Request{Method: []byte("GET"), Path: []byte("/anything")}
	if l := p.Services[0].Match(r); l == nil || l.Name != "*" || !l.Protected() {
		t.Fatalf("implicit location %+v", l)
	}
	if l := p.Services[1].Match(r); l != nil {
		t.Fatalf("empty locations matched %+v", l)
	}
}

func BenchmarkMatch(b *testing.B) {
	p := ptLoad(b, ptMatchPolicy)
	s := p.Services[0]
	r := ptRequest()
	r.Method = []byte("GET")
	r.Path = []byte("/api/x")
	b.ReportAllocs()
	for b.Loop() {
		_ = s.Match(r)
	}
}

func TestNormalizePath(t *testing.T) {
	cases := []struct {
		in, want string
		ok       bool
	}{
		{"/", "/", true},
		{"/api/items", "/api/items", true},
		{"/api/", "/api/", true},
		{"//api///items", "/api/items", true},
		{"/%61pi/", "/api/", true},
		{"/%7euser/%2Fx%2f", "/~user/x/", true},
		{"/api%2fx", "/api/x", true},
		{"/api%2F%2f/x", "/api/x", true},
		{"%2Fapi", "", false}, // origin-form starts with a raw '/'
		{"/a%5Cb", "/a\\b", true},
		{"/a%5c..%5cb", "/a\\..\\b", true}, // a backslash is not a separator
		{"/x%2", "", false},
		{"/a/./b/.", "/a/b/", true},
		{"/a/b/../c", "/a/c", true},
		{"/a/b/..", "/a/", true},
		{"/../../a", "/a", true},
		{"/..", "/", true},
		{"/.", "/", true},
		{"/%2e%2E/admin", "/admin", true},
		{"/a/%2e%2e%2fadmin", "/admin", true},
		{"/a/b%2f..%2F..%2fc", "/c", true},
		{"/a..b/.c", "/a..b/.c", true},
		{"/x%", "", false},
		{"/x%4", "", false},
		{"/x%zz", "", false},
		{"api", "", false},
		{"", "", false},
	}
	for _, tc := range cases {
		got, ok := NormalizePath([]byte("k"), []byte(tc.in))
		if ok != tc.ok || (ok && string(got) != "k"+tc.want) || (!ok && string(got) != "k") {
			t.Errorf("NormalizePath(%q) = %q, %v; want %q, %v", tc.in, got, ok, tc.want, tc.ok)
		}
	}
}

// manyLocations is a service of n locations: a health check, n-2
// path_prefix locations /svcI/ limited by methods (so that each candidate
// is tested), and a catch-all.
func manyLocations(n int) *Service {
	s := &Service{Name: "web"}
	add := func(m Match) {
		s.Locations = append(s.Locations, &Location{Service: s, Name: fmt.Sprint(len(s.Locations)), Match: m})
	}
	add(Match{Path: "/healthz"})
	for i := 0; i < n-2; i++ {
		add(Match{PathPrefix: fmt.Sprintf("/svc%d/", i), Methods: []string{"POST"}})
	}
	add(Match{PathPrefix: "/"})
	s.IndexLocations()
	return s
}

// BenchmarkMatchLocations: a request that reaches the catch-all (every
// /svcI/ prefix but its own ruled out) among 10 and 10,000 locations.
func BenchmarkMatchLocations(b *testing.B) {
	for _, n := range []int{10, 10000} {
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			s := manyLocations(n)
			r := ptRequest()
			r.Method, r.Path = []byte("GET"), []byte("/svc7/items/42")
			if l := s.Match(r); l != s.Locations[len(s.Locations)-1] {
				b.Fatalf("matched %v", l)
			}
			b.ReportAllocs()
			for b.Loop() {
				_ = s.Match(r)
			}
		})
	}
}
