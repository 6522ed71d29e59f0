package admission

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
)

// linearMatch is the documented rule itself: the first location in file
// order whose every condition holds.
func linearMatch(s *Service, r *Request) *Location {
	for _, l := range s.Locations {
		if l.Match.matches(r) {
			return l
		}
	}
	return nil
}

// indexedService builds a service from match conditions and indexes it
// (whatever their number).
func indexedService(ms []Match) *Service {
	s := &Service{Name: "s"}
	for i, m := range ms {
		s.Locations = append(s.Locations, &Location{Service: s, Name: fmt.Sprint(i), Match: m})
	}
	for len(s.Locations) < indexMinLocations { // never matching fillers, at the end
		s.Locations = append(s.Locations, &Location{Service: s, Name: fmt.Sprint(len(s.Locations)), Match: Match{Methods: []string{"NEVER"}}})
	}
	s.IndexLocations()
	return s
}

func TestMatchIndexFirstMatchWins(t *testing.T) {
	ms := []Match{
		{Path: "/healthz"},
		{PathPrefix: "/api/v1/", Methods: []string{"POST"}},
		{PathPrefix: "/api/"},
		{PathPrefix: "/api/v1/"}, // shadowed by /api/
		{PathPrefix: "/ap"},
		{Path: "/api/v1/x"}, // shadowed by /api/
		{Hosts: []string{"h.example"}},
		{PathPrefix: "/"},
	}
	s := indexedService(ms)
	if s.index == nil {
		t.Fatal("not indexed")
	}
	for _, tc := range []struct {
		method, host, path string
		want               string // location name, "" = none
	}{
		{"GET", "x", "/healthz", "0"},
		{"GET", "x", "/healthz/", "7"},
		{"POST", "x", "/api/v1/x", "1"},
		{"GET", "x", "/api/v1/x", "2"},
		{"GET", "x", "/api", "4"},
		{"GET", "h.example", "/apx", "4"},
		{"GET", "h.example", "/b", "6"},
		{"GET", "x", "/b", "7"},
		{"GET", "x", "*", ""},
		{"GET", "x", "", ""},
	} {
		r := &Request{Method: []byte(tc.method), Host: []byte(tc.host), Path: []byte(tc.path)}
		got := ""
		if l := s.Match(r); l != nil {
			got = l.Name
		}
		if got != tc.want {
			t.Errorf("%s %s %s: location %q, want %q", tc.method, tc.host, tc.path, got, tc.want)
		}
		if want := linearMatch(s, r); want != s.Match(r) {
			t.Errorf("%s: index and scan disagree", tc.path)
		}
	}
}

// A path along more prefix nodes than the index merges is matched by the
// scan, with the same answer.
func TestMatchIndexManyPrefixesOfOnePath(t *testing.T) {
	var ms []Match
	for i := 1; i <= 2*maxCandidateLists; i++ {
		ms = append(ms, Match{PathPrefix: "/" + strings.Repeat("a", i), Methods: []string{"POST"}})
	}
	ms = append(ms, Match{PathPrefix: "/" + strings.Repeat("a", 3)})
	s := indexedService(ms)
	r := &Request{Method: []byte("GET"), Path: []byte("/" + strings.Repeat("a", 3*maxCandidateLists))}
	if l := s.Match(r); l == nil || l != linearMatch(s, r) || l.Name != fmt.Sprint(2*maxCandidateLists) {
		t.Fatalf("matched %v", l)
	}
	if _, ok := s.index.match(s.Locations, r); ok {
		t.Fatal("the index merged more lists than it holds")
	}
}

// Locations changed after indexing are matched by the scan.
func TestMatchIndexStale(t *testing.T) {
	s := indexedService([]Match{{PathPrefix: "/a/"}})
	s.Locations = append([]*Location{{Service: s, Name: "new", Match: Match{PathPrefix: "/"}}}, s.Locations...)
	if l := s.Match(&Request{Path: []byte("/a/x")}); l == nil || l.Name != "new" {
		t.Fatalf("matched %v, want the location added after indexing", l)
	}
}

// randomMatches draws conditions over a small alphabet, so that prefixes
// share edges, nest and repeat.
func randomMatches(rng *rand.Rand, n int) []Match {
	seg := func() string {
		var b strings.Builder
		b.WriteByte('/')
		for k := rng.IntN(4); k > 0; k-- {
			b.WriteByte("ab/"[rng.IntN(3)])
		}
		return b.String()
	}
	ms := make([]Match, n)
	for i := range ms {
		switch rng.IntN(5) {
		case 0:
			ms[i].Path = seg()
		case 1, 2, 3:
			ms[i].PathPrefix = seg()
		}
		if rng.IntN(3) == 0 {
			ms[i].Methods = []string{[]string{"GET", "POST"}[rng.IntN(2)]}
		}
	}
	return ms
}

// The index answers exactly as the linear scan on random policies and
// paths.
func TestMatchIndexAgreesWithScan(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for round := 0; round < 300; round++ {
		s := indexedService(randomMatches(rng, 1+rng.IntN(60)))
		for q := 0; q < 50; q++ {
			p := randomMatches(rng, 1)[0]
			path := p.Path + p.PathPrefix + "ab"[:rng.IntN(3)]
			r := &Request{Method: []byte([]string{"GET", "POST"}[rng.IntN(2)]), Path: []byte(path)}
			if got, want := s.Match(r), linearMatch(s, r); got != want {
				t.Fatalf("round %d, %s %q: index %v, scan %v", round, r.Method, path, got, want)
			}
		}
	}
}

// FuzzMatchIndex: the index and the scan pick the same location. The
// input is the policy's path conditions, one per line ("=" exact, "^"
// prefix, "*" none; a trailing "!" restricts to POST), then a line with
// the request path.
func FuzzMatchIndex(f *testing.F) {
	for _, s := range []string{
		"^/api/\n=/healthz\n^/\n/api/x",
		"^/a!\n^/ab\n^/a\n*\n/abc",
		"^/x/y\n^/x\n=/x/y\n/x/y",
		"^/\n\n",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		lines := strings.Split(in, "\n")
		if len(lines) < 2 || len(lines) > 200 {
			return
		}
		var ms []Match
		for _, l := range lines[:len(lines)-1] {
			if l == "" {
				continue
			}
			var m Match
			if strings.HasSuffix(l, "!") {
				m.Methods, l = []string{"POST"}, l[:len(l)-1]
			}
			switch {
			case strings.HasPrefix(l, "="):
				m.Path = l[1:]
			case strings.HasPrefix(l, "^"):
				m.PathPrefix = l[1:]
			}
			ms = append(ms, m)
		}
		s := indexedService(ms)
		path := lines[len(lines)-1]
		for _, meth := range []string{"GET", "POST"} {
			r := &Request{Method: []byte(meth), Path: []byte(path)}
			if got, want := s.Match(r), linearMatch(s, r); got != want {
				t.Fatalf("%s %q: index %v, scan %v", meth, path, got, want)
			}
		}
	})
}
