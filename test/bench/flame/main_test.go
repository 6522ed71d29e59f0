package main

import (
	"bytes"
	"encoding/xml"
	"errors"
	"io"
	"strings"
	"testing"
)

// Two samples in perf script's layout (leaf first, blank line between).
const script = `rl-tproxy 1234 [001] 100.000001:   1001001 cpu-clock:pppH: 
	ffffffff81000001 tcp_sendmsg+0x1d ([kernel.kallsyms])
	ffffffff81000002 do_syscall_64+0x5d ([kernel.kallsyms])
	          4a1b2c syscall.RawSyscall+0x10 (/usr/bin/rl-tproxy)
	          4a1b3d main.serve+0x22 (/usr/bin/rl-tproxy)

rl-tproxy 1234 [001] 100.000002:   1001001 cpu-clock:pppH: 
	          4a1b3d main.serve+0x22 (/usr/bin/rl-tproxy)
	          4a1b3d main.serve+0x30 (/usr/bin/rl-tproxy)
	                0 [unknown] ([unknown])

`

func TestParse(t *testing.T) {
	root, self, incl, err := parse(strings.NewReader(script))
	if err != nil {
		t.Fatal(err)
	}
	if root.n != 2 {
		t.Fatalf("samples = %d, want 2", root.n)
	}
	for _, tc := range []struct {
		m    map[string]int
		name string
		want int
	}{
		{self, "tcp_sendmsg", 1},
		{self, "main.serve", 1},
		{self, "do_syscall_64", 0},
		{incl, "main.serve", 2}, // counted once per sample, even when recursive
		{incl, "do_syscall_64", 1},
		{incl, "[unknown] ([unknown])", 1},
	} {
		if got := tc.m[tc.name]; got != tc.want {
			t.Errorf("%s: %d, want %d", tc.name, got, tc.want)
		}
	}
	// The first sample's outermost frame is main.serve, the second's
	// [unknown]: two subtrees under the root.
	if len(root.children) != 2 {
		t.Errorf("root has %d children, want 2", len(root.children))
	}
}

func TestFrameName(t *testing.T) {
	for _, tc := range []struct{ line, want string }{
		{"\tffffffff81000001 tcp_sendmsg+0x1d ([kernel.kallsyms])", "tcp_sendmsg"},
		{"\t4a1b2c github.com/x/y.(*conn).serve+0x10 (/bin/p)", "github.com/x/y.(*conn).serve"},
		{"\t0 [unknown] (/usr/sbin/nginx)", "[unknown] (/usr/sbin/nginx)"},
		{"\t4a1b2c", "?"},
	} {
		if got := frameName(tc.line); got != tc.want {
			t.Errorf("frameName(%q) = %q, want %q", tc.line, got, tc.want)
		}
	}
}

func TestSVGIsWellFormed(t *testing.T) {
	root, _, _, err := parse(strings.NewReader(script))
	if err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	writeSVG(&b, root, `a <title> & "quotes"`)
	checkXML(t, b.Bytes())
}

func checkXML(t *testing.T, b []byte) {
	t.Helper()
	d := xml.NewDecoder(bytes.NewReader(b))
	for {
		_, err := d.Token()
		if errors.Is(err, io.EOF) {
			return
		}
		if err != nil {
			t.Fatalf("SVG is not well-formed XML: %v", err)
		}
	}
}

// FuzzParse: any input parses without panicking, and whatever it parses
// renders as well-formed XML.
func FuzzParse(f *testing.F) {
	f.Add(script)
	f.Add("x 1 [0] 1.0: 1 c:\n\t1 a+0x1 (b)\n\t2 <&>+0x2 (c)\n")
	f.Fuzz(func(t *testing.T, in string) {
		root, _, _, err := parse(strings.NewReader(in))
		if err != nil || root.n == 0 {
			return
		}
		var b bytes.Buffer
		writeSVG(&b, root, "fuzz")
		checkXML(t, b.Bytes())
	})
}
