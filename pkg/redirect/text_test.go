package redirect

import (
	"net/netip"
	"strings"
	"testing"
)

func TestStateWriteText(t *testing.T) {
	cases := []struct {
		name string
		st   State
		want []string
	}{
		{"not attached", State{NetnsInode: 7, Reason: "nothing pinned at /x/7/link"},
			[]string{"not attached (network namespace inode 7)", "nothing pinned at /x/7/link"}},
		{"attached", State{
			Pinned: true, NetnsInode: 9, Dir: "/sys/fs/bpf/rl-tproxy/9", LinkID: 3, ProgramID: 4, ProgramTag: "abcd",
			MatchesBinary: true, Ports: []uint16{80, 443}, Prefixes: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")},
			Sockets:  []Socket{{Slot: 0, Family: "ipv4", Present: true, Cookie: 42}, {Slot: 1, Family: "ipv6"}},
			Counters: Counters{Steered: 5, NoSocket: 2},
		}, []string{"attached (network namespace inode 9)", "tag abcd, matches this binary: yes", "steered ports:   80, 443",
			"destinations:    10.0.0.0/8", "local clients:   not steered", "ipv4 listener:   listener present (socket cookie 42)",
			"ipv6 listener:   empty", "steered       5", "no_socket     2", "assign_error  0"}},
		{"foreign program", State{Pinned: true, ProgramTag: "ffff"}, []string{"matches this binary: no", "steered ports:   none", "destinations:    any"}},
		{"unknown program", State{Pinned: true}, []string{"tag unknown (the pinned program is not the attached one)"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var b strings.Builder
			if err := tc.st.WriteText(&b); err != nil {
				t.Fatal(err)
			}
			for _, w := range tc.want {
				if !strings.Contains(b.String(), w) {
					t.Errorf("output lacks %q:\n%s", w, b.String())
				}
			}
		})
	}
}
