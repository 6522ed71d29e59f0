package fileerr

import "testing"

func TestListJoinsEveryErrorWithItsLine(t *testing.T) {
	l := &List{Errs: []Error{{"p.yaml", 3, "unknown key \"x\""}, {"c.yaml", 1, "missing secret"}}}
	want := "p.yaml:3: unknown key \"x\"\nc.yaml:1: missing secret"
	if got := l.Error(); got != want {
		t.Fatalf("got %q, want %q", got, want)
	}
}
