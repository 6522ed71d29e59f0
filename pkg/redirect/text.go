package redirect

import (
	"fmt"
	"io"
	"strings"
)

// WriteText writes the state for humans (`rl-tproxy redirect status`).
func (s *State) WriteText(w io.Writer) error {
	var b strings.Builder
	if !s.Pinned {
		fmt.Fprintf(&b, "not attached (network namespace inode %d)\n", s.NetnsInode)
		if s.Reason != "" {
			fmt.Fprintf(&b, "  %s\n", s.Reason)
		}
		_, err := io.WriteString(w, b.String())
		return err
	}
	match := "no: start the proxy with upgrade enabled to replace it, or detach"
	if s.MatchesBinary {
		match = "yes"
	}
	tag := s.ProgramTag
	if tag == "" {
		tag = "unknown (the pinned program is not the attached one)"
	}
	fmt.Fprintf(&b, "attached (network namespace inode %d)\n", s.NetnsInode)
	fmt.Fprintf(&b, "  pins:            %s\n", s.Dir)
	fmt.Fprintf(&b, "  link id:         %d\n", s.LinkID)
	fmt.Fprintf(&b, "  program:         id %d, tag %s, matches this binary: %s\n", s.ProgramID, tag, match)
	ports := make([]string, len(s.Ports))
	for i, p := range s.Ports {
		ports[i] = fmt.Sprint(p)
	}
	if len(ports) == 0 {
		ports = []string{"none"}
	}
	fmt.Fprintf(&b, "  steered ports:   %s\n", strings.Join(ports, ", "))
	prefixes := make([]string, len(s.Prefixes))
	for i, p := range s.Prefixes {
		prefixes[i] = p.String()
	}
	if len(prefixes) == 0 {
		prefixes = []string{"any"}
	}
	fmt.Fprintf(&b, "  destinations:    %s\n", strings.Join(prefixes, ", "))
	fmt.Fprintf(&b, "  local clients:   %s\n", map[bool]string{true: "steered", false: "not steered"}[s.SteerLoopback])
	for _, sk := range s.Sockets {
		state := "empty (connections fall through to the service)"
		if sk.Present {
			state = fmt.Sprintf("listener present (socket cookie %d)", sk.Cookie)
		}
		fmt.Fprintf(&b, "  %s listener:   %s\n", sk.Family, state)
	}
	fmt.Fprintf(&b, "  bypass entries:  %d\n", s.BypassEntries)
	fmt.Fprintf(&b, "  counters:\n")
	for _, c := range s.Counters.Values() {
		fmt.Fprintf(&b, "    %-13s %d\n", c.Name, c.Value)
	}
	_, err := io.WriteString(w, b.String())
	return err
}
