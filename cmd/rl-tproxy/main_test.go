package main

import (
	"bytes"
	"strings"
	"testing"
)

// Every subcommand answers --help with exit 0 and its usage on stdout.
func TestHelpExitsZero(t *testing.T) {
	cases := [][]string{{"--help"}, {"help"}}
	for name := range commands {
		cases = append(cases, []string{name, "--help"})
	}
	cases = append(cases, []string{"redirect", "status", "--help"}, []string{"redirect", "detach", "--help"})
	for _, args := range cases {
		var out, errb bytes.Buffer
		if code := dispatch(args, &out, &errb); code != exitOK {
			t.Errorf("%v: exit %d, stderr %q", args, code, errb.String())
		}
		if !strings.Contains(out.String(), "Usage: rl-tproxy") {
			t.Errorf("%v: no usage on stdout: %q", args, out.String())
		}
	}
}

func TestUnknownCommandAndFlagAreInvalid(t *testing.T) {
	for _, args := range [][]string{{}, {"nope"}, {"version", "--nope"}, {"redirect", "sideways"}} {
		var out, errb bytes.Buffer
		if code := dispatch(args, &out, &errb); code != exitInvalid {
			t.Errorf("%v: exit %d, want %d", args, code, exitInvalid)
		}
	}
}

func TestVersionPrintsCommitAndGo(t *testing.T) {
	var out, errb bytes.Buffer
	if code := dispatch([]string{"version"}, &out, &errb); code != exitOK {
		t.Fatalf("exit %d", code)
	}
	if s := out.String(); !strings.Contains(s, "commit ") || !strings.Contains(s, "go1.") {
		t.Fatalf("version output %q lacks commit or Go version", s)
	}
}

// --help prints the usage once, to stdout only; a bad flag prints it once to stderr.
func TestHelpPrintsUsageOnce(t *testing.T) {
	var out, errb bytes.Buffer
	if code := dispatch([]string{"version", "--help"}, &out, &errb); code != exitOK {
		t.Fatalf("exit %d", code)
	}
	if n := strings.Count(out.String(), "Usage:"); n != 1 || errb.Len() != 0 {
		t.Fatalf("usage on stdout %d times, stderr %q", n, errb.String())
	}
	out.Reset()
	errb.Reset()
	if code := dispatch([]string{"version", "--bogus"}, &out, &errb); code != exitInvalid {
		t.Fatalf("exit %d", code)
	}
	if n := strings.Count(errb.String(), "Usage:"); n != 1 || out.Len() != 0 || !strings.Contains(errb.String(), "bogus") {
		t.Fatalf("bad flag: stderr %q stdout %q", errb.String(), out.String())
	}
}
